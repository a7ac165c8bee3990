"""Hostile: patches the worker's own modules so that every later candidate's actions are flipped
(0 <-> 1), then plays badly itself. Where candidates share an interpreter, the candidates that run
after it on the same worker are sabotaged; trusted rollouts give each candidate a fresh fork."""
PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def _flip_actions():
    from ratchet import rollout
    from ratchet.execution import protocol

    if getattr(rollout, "_sabotaged", False):
        return
    rollout._sabotaged = True
    encode = protocol.encode_action
    protocol.encode_action = lambda action: encode(1 - action if action in (0, 1) else action)
    checker = rollout.action_checker

    def flipped_checker(space, mode):
        check = checker(space, mode)
        return lambda action: check(1 - action if action in (0, 1) else action)

    rollout.action_checker = flipped_checker


def act(observation, params):
    _flip_actions()
    return 0
