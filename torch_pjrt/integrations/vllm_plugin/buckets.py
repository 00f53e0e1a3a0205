"""Padded shapes. Every step's program has one of a few token counts and request
counts, fixed at start-up from the scheduler's limits and all compiled then, so
serving compiles nothing new."""

from __future__ import annotations

import dataclasses

# A decode step of a few requests multiplies few rows by every weight: padded to 16 rows, a
# step of 1 to 3 requests took 3 to 4 ms more on llama-large (8 layers, hidden 512).
SMALLEST_TOKENS = 4
SMALLEST_REQUESTS = 8
# Attention reads a request's context once per tile of up to this many of its query tokens.
LARGEST_TILE = 32


def _powers_of_two(smallest: int, largest: int) -> tuple[int, ...]:
    sizes = []
    size = smallest
    while size < largest:
        sizes.append(size)
        size *= 2
    sizes.append(largest)
    return tuple(sorted(set(sizes)))


@dataclasses.dataclass(frozen=True)
class Buckets:
    tokens: tuple[int, ...]  # padded token counts of a step
    requests: tuple[int, ...]  # padded request counts of a step (rows of logits)

    @classmethod
    def for_limits(cls, max_num_batched_tokens: int, max_num_seqs: int) -> "Buckets":
        return cls(_powers_of_two(min(SMALLEST_TOKENS, max_num_batched_tokens), max_num_batched_tokens),
                   _powers_of_two(min(SMALLEST_REQUESTS, max_num_seqs), max_num_seqs))

    @staticmethod
    def _pick(sizes: tuple[int, ...], n: int, what: str) -> int:
        for size in sizes:
            if n <= size:
                return size
        raise ValueError(f"vLLM on pjrt: {n} {what} exceed the largest compiled bucket {sizes[-1]}")

    def tokens_for(self, num_tokens: int) -> int:
        return self._pick(self.tokens, num_tokens, "tokens")

    def requests_for(self, num_requests: int) -> int:
        return self._pick(self.requests, num_requests, "requests")

    @staticmethod
    def tile_rows(tokens: int, requests: int) -> int:
        """Query tokens per attention tile in a (tokens, requests) bucket: 1 where the bucket is
        mostly decodes (a token per request), more as prefill tokens outnumber requests
        (a power of two up to LARGEST_TILE)."""
        rows = 1
        while rows * 2 <= min(LARGEST_TILE, tokens // (2 * requests)):
            rows *= 2
        return rows

    @classmethod
    def tiles(cls, tokens: int, requests: int) -> int:
        """Attention tiles a step of that bucket can need: each request's tokens in tiles of
        tile_rows, every tile holding at least one token."""
        rows = cls.tile_rows(tokens, requests)
        return min(tokens, -(-(tokens + requests * (rows - 1)) // rows))

    def forward_shapes(self) -> list[tuple[int, int]]:
        """Every (tokens, requests) pair a step can have: a request has at least one token."""
        return [(t, r) for t in self.tokens for r in self.requests if r <= t or r == self.requests[0]]
