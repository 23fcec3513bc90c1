"""bench_llamacpp's tables from known results: ratios against llama.cpp, token agreement."""

from __future__ import annotations

from benchmarks.bench_llamacpp import Result
from benchmarks.llamacpp_load import LoadResult
from benchmarks.llamacpp_report import batch1_table, first_difference, load_table


def test_first_difference_counts_equal_tokens_before_the_first_change() -> None:
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert first_difference([1, 2, 3], [1, 2, 3]) == 3
    assert first_difference([5], [6, 7]) == 0


def test_batch1_rows_compare_each_side_with_llama_cpp() -> None:
    results = [
        Result("llama.cpp", "short", 0, 50, 0.5, 100.0, [1, 2, 3], 3),
        Result("specserve q8", "short", 0, 50, 0.25, 150.0, [1, 2, 9], 2),
        Result("llama.cpp", "long", 0, 1000, 4.0, 50.0, [4, 5], 1),
        Result("specserve q8", "long", 0, 1000, 2.0, 40.0, [4, 5], 1),
    ]
    lines = batch1_table(results).splitlines()
    ours_short = next(line for line in lines if "short" in line and "specserve" in line)
    assert "| 150.0 | 1.50x | 200 | 2.00x | 0/1 (first difference at 2) | 0/1 (first " in ours_short
    ours_long = next(line for line in lines if "long" in line and "specserve" in line)
    assert "| 40.0 | 0.80x | 500 | 2.00x |" in ours_long
    assert ours_long.endswith("| 1/1 (first difference at 2) |")  # equal to llama.cpp's


def test_load_rows_divide_by_llama_cpp_throughput() -> None:
    load = [
        LoadResult("llama.cpp", "short", 16, 800, 2048, 20.48),
        LoadResult("specserve q8", "short", 16, 800, 2048, 10.24),
    ]
    table = load_table(load, 16)
    assert "-np 16" in table
    assert "| short (~50 tokens) | specserve q8 | 10.2 | 200.0 | 2.00x |" in table
