"""Hostile: when its episode is rendered (``ratchet replay --video``), leaves a symlink to
``/tmp/ratchet-secret-<tag>`` where the GIF should be (it patches ``imageio.v2.mimsave``, which the
worker calls after the episode)."""
import os

PARAMETERS = {"tag": {"default": 0.0, "low": 0.0, "high": 1e9}}


def act(observation, params):
    import imageio.v2

    def mimsave(path, *args, **kwargs):
        path = str(path)
        if os.path.lexists(path):
            os.remove(path)
        os.symlink(f"/tmp/ratchet-secret-{int(params['tag'])}", path)

    imageio.v2.mimsave = mimsave
    return 0
