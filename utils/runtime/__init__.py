"""The runtime every layer stands on, and which knows none of them: the flags base (flags.py), processes and their
Accelerator (process.py), output directories refused and published as a whole (output_dir.py), and batching
(batching.py). The training loop, the search, the reader, the retriever and the QA system all import it; it imports
none of them."""
