"""A TCP forwarder on a loopback port that a test can cut: a database node that dies, without
touching the server behind it. ``stop`` closes the listening socket and every forwarded
connection (the client sees its connection reset, then connection refused)."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target``; ``start`` and ``stop`` may alternate."""

    def __init__(self, target: tuple[str, int], port: int = 0) -> None:
        self.target = target
        self.port = port
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                # What a client sees of a server process that died: its connection closes.
                sock.shutdown(socket.SHUT_RDWR)

    @property
    def connections(self) -> int:
        """Client connections open through the proxy (two sockets each)."""
        with self._lock:
            return len(self._sockets) // 2

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._sockets.update((client, server))
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(sink)
            for sock in (source, sink):
                # shutdown first: a close alone would leave the other direction's reader blocked
                # and the connection open.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
