"""The store's memory as one budget (`store_memory_mb`): DuckDB's buffer, the indexes, the chunk cache.

Three things hold the store's memory, and only two of them can be told how much to take:

- DuckDB's buffer manager (its table pages, unwritten rows, statements' working memory) takes at
  most its `memory_limit`: a quarter of the budget, never under `DUCKDB_FLOOR_MB`. Below 64 MB the
  writer's merges and two concurrent reads run out of memory (bench/README.md, "Soak");
- the indexes are what the data is: the series catalogue (~1 KB a series, bench/README.md "Series
  creation"), where every chunk lies (36 B a chunk, `chunkindex.py`) and the head's index (8 B a
  series). They cannot shrink without forgetting data, so they are counted, not limited;
- the decoded chunk cache takes what is left, and gives back as the indexes grow (at least
  `CACHE_FLOOR_MB`: below that the dashboard's refreshes decode every chunk each time). When the
  indexes leave it less than that the budget is overdrawn, which `overdrawn` says, so that the
  operator hears it once (raise `store_memory_mb`, or keep raw samples for a shorter `retention`).

What it does not count: Python's own objects for requests and scrapes, and the allocator's free
pieces (README, "Storage": what gpuwatch costs a machine).
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 2**20
DUCKDB_FLOOR_MB = 64
CACHE_FLOOR_MB = 16
SERIES_BYTES = 1_000  # the catalogue's entry and labels for one series (bench/README.md, ~983-1,009 B)
MIN_MB = DUCKDB_FLOOR_MB + CACHE_FLOOR_MB + 16  # the smallest budget the setting takes
DEFAULT_MB = 256


@dataclass(frozen=True)
class MemoryBudget:
    """How `total_mb` of memory is shared out between DuckDB, the indexes and the chunk cache."""

    total_mb: int = DEFAULT_MB
    cache_cap_mb: int | None = None  # `chunk_cache_mb`, where set: the cache never takes more

    def __post_init__(self) -> None:
        if self.total_mb < MIN_MB:
            raise ValueError(f"store_memory_mb must be at least {MIN_MB} (got {self.total_mb})")

    @property
    def duckdb_mb(self) -> int:
        """DuckDB's `memory_limit`, in MB."""
        return max(DUCKDB_FLOOR_MB, self.total_mb // 4)

    @staticmethod
    def index_bytes(series: int, chunk_index_bytes: int) -> int:
        """What the indexes hold for `series` series and a chunk index of `chunk_index_bytes`."""
        return series * (SERIES_BYTES + 8) + chunk_index_bytes

    def cache_bytes(self, index_bytes: int) -> int:
        """The chunk cache's share while the indexes hold `index_bytes`."""
        left = (self.total_mb - self.duckdb_mb) * MB - index_bytes
        share = max(CACHE_FLOOR_MB * MB, left)
        if self.cache_cap_mb is not None:
            share = min(share, self.cache_cap_mb * MB)
        return share

    def overdrawn(self, index_bytes: int) -> bool:
        """Whether the indexes leave the cache less than its floor (the budget is too small)."""
        return (self.total_mb - self.duckdb_mb) * MB - index_bytes < CACHE_FLOOR_MB * MB
