"""Length-prefixed messages over a pair of pipes, read with a size cap and a deadline.

The trusted env host and the sandboxed policy process talk over two pipes (one each way). Pipes
are the cheapest local round trip Linux offers; each message is a 4-byte big-endian length and then
its bytes. The reader keeps a buffer, so a message normally costs one ``read`` system call.

Nothing here trusts the other end: a length over the cap, a stalled message, or the other end
closing raise :class:`BadMessage`, :class:`ChannelTimeout` or ``EOFError``; the caller decides
what that means for the episode.
"""

from __future__ import annotations

import os
import select
import struct
import time

__all__ = ["BadMessage", "Channel", "ChannelTimeout", "pin_to_cpu"]

_HEADER = struct.Struct("!I")
_READ_SIZE = 1 << 16


class BadMessage(Exception):
    """The other end sent something that is not a well-formed message (e.g. over the size cap)."""


class ChannelTimeout(Exception):
    """No complete message arrived before the deadline."""


class Channel:
    """One end of a two-pipe connection.

    Args:
        read_fd: Pipe to read messages from.
        write_fd: Pipe to write messages to.
        max_message: Largest message accepted from the other end, in bytes.
    """

    def __init__(self, read_fd: int, write_fd: int, max_message: int = 1 << 20) -> None:
        self.read_fd, self.write_fd, self.max_message = read_fd, write_fd, max_message
        self._buf = bytearray()
        self._poll = select.poll()
        self._poll.register(read_fd, select.POLLIN)

    def send(self, payload: bytes) -> None:
        """Write one message (blocking until the pipe takes it all).

        Raises:
            BrokenPipeError: the other end is gone.
        """
        header = _HEADER.pack(len(payload))
        n = os.writev(self.write_fd, (header, payload))  # one system call in the common case
        if n < 4 + len(payload):
            view = memoryview(header + payload)[n:]
            while view:
                view = view[os.write(self.write_fd, view):]

    def recv(self, deadline: float | None = None) -> bytes:
        """Read one message.

        Args:
            deadline: ``time.monotonic()`` value after which to give up; None waits forever.

        Raises:
            EOFError: the other end closed its pipe.
            ChannelTimeout: the deadline passed first.
            BadMessage: the announced length exceeds ``max_message``.
        """
        buf = self._buf
        if not buf and deadline is None:  # fast path: one read brings exactly one whole message
            chunk = os.read(self.read_fd, _READ_SIZE)
            if not chunk:
                raise EOFError
            if len(chunk) >= 4 and _HEADER.unpack_from(chunk)[0] == len(chunk) - 4:
                return chunk[4:]
            buf += chunk
        while True:
            if len(buf) >= 4:
                (n,) = _HEADER.unpack_from(buf)
                if n > self.max_message:
                    raise BadMessage(f"a message of {n:,} bytes (at most {self.max_message:,} allowed)")
                if len(buf) >= 4 + n:
                    msg = bytes(buf[4:4 + n])
                    del buf[:4 + n]
                    return msg
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._poll.poll(max(1, int(remaining * 1000) + 1)):
                    if time.monotonic() >= deadline:
                        raise ChannelTimeout()
                    continue
            chunk = os.read(self.read_fd, _READ_SIZE)
            if not chunk:
                raise EOFError
            buf += chunk

    def drain(self) -> int:
        """Discard everything the other end has written and this end has not read (buffered or in the pipe, as
        far as it can be read without waiting). Returns the bytes discarded."""
        n = len(self._buf)
        self._buf.clear()
        os.set_blocking(self.read_fd, False)
        try:
            while True:
                chunk = os.read(self.read_fd, _READ_SIZE)
                if not chunk:
                    break
                n += len(chunk)
        except BlockingIOError:
            pass
        finally:
            os.set_blocking(self.read_fd, True)
        return n

    def close(self) -> None:
        """Close both pipes (safe to call twice)."""
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.read_fd = self.write_fd = -1


def pin_to_cpu() -> None:
    """Pin this process to the CPU named by ``RATCHET_CPU`` (when set). Both processes of a trusted
    rollout pin to the same CPU: a round trip between processes on one core costs about 20 µs, across
    cores several times that (the other core must be woken), and the two never run at once anyway."""
    cpu = os.environ.pop("RATCHET_CPU", "")
    if cpu.isdigit():
        try:
            os.sched_setaffinity(0, {int(cpu)})
        except (OSError, AttributeError):
            pass
