"""Hostile: connects to a TCP port on the host's loopback (port given as parameter ``port``)."""
import socket

PARAMETERS = {"port": {"default": 1.0, "low": 1.0, "high": 65535.0}}


def act(observation, params):
    with socket.create_connection(("127.0.0.1", int(params["port"])), timeout=2) as conn:
        conn.sendall(b"stolen")
    return 0
