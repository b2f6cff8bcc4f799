"""What the reader and the retriever both read: SQuAD-format files (files.py) and answer text, its normalisation and
the one matcher of answers in texts (answers.py)."""
