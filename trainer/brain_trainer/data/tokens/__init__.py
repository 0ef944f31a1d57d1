"""Token datasets: `braintrain prepare` turns a corpus into token shards; training reads them memory-mapped.

Modules, one job each (docs/data.md describes the folder):
format (the folder layout, manifest and split rule; torch-free),
corpus (input files -> documents), compression (gzip, bzip2 and Zstandard inputs), tokenizer (bytes, a tokenizers file, or a trained BPE),
writer (shards and the atomic commit of a dataset folder), report (progress display),
prepare (the pipeline and its command line), dataset (the torch Dataset over a split).
A dataset in a bucket (s3://bucket/prefix): bucket (the store, through s3fs), publish (prepare's upload, the manifest
last), streamed (the torch Dataset reading a split by byte range).
"""
