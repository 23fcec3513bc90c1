"""Our own benchmarks (not shipped in the specserve package): run from the repo root as
`python -m benchmarks.<name>`; docs/benchmarks.md has the commands and results."""
