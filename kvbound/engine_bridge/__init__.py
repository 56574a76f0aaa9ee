"""Minimal paged-KV executor that replays schedules and measures batch times (filled by the executor work)."""
