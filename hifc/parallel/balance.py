"""Which replica gets a new request: the one with the fewest outstanding tokens. Torch-free.

A request's outstanding tokens are its prompt plus the tokens it may still generate (at most
``max_model_len`` in all); they shrink as its tokens arrive and vanish when it ends. Ties go to
the lowest replica index, so a fixed sequence of requests is placed the same way every time.
"""
from __future__ import annotations


class LeastOutstandingTokens:
    def __init__(self, num_replicas: int):
        if num_replicas < 1:
            raise ValueError("a balancer needs at least one replica")
        self.outstanding = [0] * num_replicas  # per replica
        self._requests: dict[str, tuple[int, int]] = {}  # request id -> (replica, tokens left)

    def place(self, request_id: str, prompt_tokens: int, max_new_tokens: int,
              max_model_len: int) -> int:
        """Choose the replica for a new request and count its tokens there."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already placed")
        replica = min(range(len(self.outstanding)), key=self.outstanding.__getitem__)
        tokens = min(prompt_tokens + max_new_tokens, max_model_len)
        self._requests[request_id] = (replica, tokens)
        self.outstanding[replica] += tokens
        return replica

    def replica_of(self, request_id: str) -> int | None:
        entry = self._requests.get(request_id)
        return None if entry is None else entry[0]

    def generated(self, request_id: str, num_tokens: int) -> None:
        """``num_tokens`` more tokens of the request arrived."""
        replica, left = self._requests[request_id]
        done = min(num_tokens, left)
        self._requests[request_id] = (replica, left - done)
        self.outstanding[replica] -= done

    def finished(self, request_id: str) -> None:
        """The request ended (or was aborted): its remaining tokens are no longer expected."""
        replica, left = self._requests.pop(request_id)
        self.outstanding[replica] -= left
