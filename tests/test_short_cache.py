"""`tracemill.short_cache`: a long text is never kept by the cache (agent contexts reach hundreds of KB each)."""

from tracemill.short_cache import cache_short


def test_short_calls_are_cached_and_long_ones_computed_each_time():
    made = []

    @cache_short(limit=10, maxsize=4)
    def upper(*texts: str) -> str:
        made.append(texts)
        return "".join(texts).upper()

    short, long = "tool line", "a pasted document"
    assert [upper(short), upper(short), upper(long), upper(long)] == [short.upper()] * 2 + [long.upper()] * 2
    assert made == [(short,), (long,), (long,)]
    assert upper("abcde", "fghij") == upper("abcde", "fghij") == "ABCDEFGHIJ"  # ten characters in all: kept
    assert upper("abcdef", "ghijk") == upper("abcdef", "ghijk") == "ABCDEFGHIJK"  # eleven: not
    assert made[3:] == [("abcde", "fghij"), ("abcdef", "ghijk"), ("abcdef", "ghijk")]
    assert upper.cache_info().currsize == 2
