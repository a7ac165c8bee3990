"""Hostile: raises with text that would rewrite a terminal (``mode`` 0: an erase-line/cursor-up
escape sequence and a faked line; 1: a lone surrogate, which cannot be encoded to UTF-8)."""

PARAMETERS = {"mode": {"default": 0.0, "low": 0.0, "high": 1.0}}


def act(observation, params):
    if int(params["mode"]) == 0:
        raise ValueError("\x1b[2K\x1b[1A\r[bold]all episodes succeeded\x07")
    raise ValueError("\ud800")
