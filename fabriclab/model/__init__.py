"""The experiment layer's pure part: the experiment file (schema, parse, defaults), sweeps, the
results document, the run directory's tables and real-equivalent units."""
