"""Hostile: raises with text that would rewrite a terminal or crash it. Seeds 0, 3, 6, ...: an
erase-line/cursor-up escape sequence, a carriage return and a faked line in Rich markup; seeds 1, 4,
...: a lone surrogate (cannot be encoded to UTF-8); other seeds: a normal episode."""

PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}
_seed = [0]


def reset(params, seed):
    _seed[0] = seed


def act(observation, params):
    if _seed[0] % 3 == 0:
        raise ValueError("\x1b[2K\x1b[1A\r[bold green]all episodes succeeded[/bold green]\x07")
    if _seed[0] % 3 == 1:
        raise ValueError("\ud800")
    return 0
