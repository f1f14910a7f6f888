"""The HTTP connection below the app (uvicorn with h11).

A request that cannot be parsed as HTTP/1.1 (a malformed request line, an invalid or repeated
Content-Length, broken chunked framing, headers larger than h11's limit of 16 KiB while they
arrive) never reaches the app: uvicorn answers it itself and closes the connection. This
protocol makes that answer a 400 in the OpenAI error format instead of uvicorn's plain text. A
client still sending when the connection closes may see it reset instead (TCP, not HTTP).
"""
from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from hifc.entrypoints.server.errors import error_body

INVALID_HTTP_MESSAGE = ("invalid HTTP request: malformed request line, headers or body framing "
                        "(Content-Length, Transfer-Encoding)")


class JSONErrorH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, answering unparseable requests with a JSON 400."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(error_body(400, INVALID_HTTP_MESSAGE)).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
