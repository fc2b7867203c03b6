"""A fabric over several machines: a Ray cluster's machines and their actors
(:mod:`.machines`), the coordinator that partitions and drives a fabric over them
(:mod:`.coordinator`), and machines as network namespaces on one host for tests
(:mod:`.nscluster`)."""
