"""Files in and checked: SQuAD (squad.py), DPR training data (dpr.py), passage corpora (corpus.py), lists of
questions (questions.py), answer text and its one matcher (answers.py), and JSON / JSON-lines reading and atomic
writing (jsonfiles.py). Every bad file is a one-line UserError naming it; nothing here knows a model."""
