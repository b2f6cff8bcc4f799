"""The token_type_ids the project's models are trained with (0 for the first segment, 1 for the second), given to
Haystack 3.x's reader and embedders, which feed none: the diagnostic runs of the haystack3 step."""


def pair_token_types(input_ids, attention_mask, sep_token_id):
    """The token_type_ids a BERT tokenizer gives a pair (a, b) for the ids of "a [SEP] b": 1 after the first
    [SEP] (b and its closing [SEP]), 0 up to it and on padding."""
    is_sep = (input_ids == sep_token_id).long()
    return (((is_sep.cumsum(1) - is_sep) >= 1) & (attention_mask == 1)).long()


class WithTokenTypes:
    """A Haystack reader's model called with the token_type_ids train_reader.py feeds it (0 question, 1 context)."""

    def __init__(self, model, sep_token_id):
        self.model, self.sep_token_id = model, sep_token_id

    def __call__(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=pair_token_types(input_ids, attention_mask, self.sep_token_id))
