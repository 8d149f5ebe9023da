"""What the tests (and the benchmarks) share: real processes, clusters, registries and images,
built once here so that each conftest only declares its own package's fixtures."""
