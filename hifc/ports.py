"""A free local TCP port, for a server or a process group's rendezvous the caller starts."""
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (another process may take it before the caller
    binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
