"""Padded shapes. Every program the engine runs has one of a few token counts (the
model forward) or request counts (the logits), fixed at start-up from the
scheduler's limits and all compiled then, so serving compiles nothing new."""

from __future__ import annotations

import dataclasses

SMALLEST_TOKENS = 16
SMALLEST_REQUESTS = 8


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
    tokens: tuple[int, ...]  # padded token counts of a forward
    requests: tuple[int, ...]  # padded row counts of a logits computation

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
        return self._pick(self.requests, num_requests, "rows of logits")
