"""The one check of a list of questions, for every way questions come in: the Python API (Retriever.search,
Retriever.encode_questions, QASystem.ask) and the server's requests (utils.system.server), which add their limits.

A question is a string that holds more than whitespace and can be written as UTF-8: a lone surrogate, which Python
strings and JSON's "\\ud800" escape allow, makes the tokenizer fail, so it is refused here, before any model sees
it. A refusal is a `QuestionError`: a UserError whose message
names the question (`question #i` in a list, as the Python API numbers them), with what the server needs to name
the field of its JSON error (`question` or `question[i]`).
"""

from utils.errors import UserError


class QuestionError(UserError):
    """A refused question list. `index`: which question of a list (None: the list as a whole, or a single string's
    question); `problem`: what is wrong; `status`: the HTTP status a server answers it with (413 for too many
    questions, else 422)."""

    def __init__(self, index: int | None, problem: str, status: int = 422):
        super().__init__(f"{'question' if index is None else f'question #{index}'}: {problem}")
        self.index, self.problem, self.status = index, problem, status

    def field(self, name: str = "question") -> str:
        """The request field it names: `name`, or `name[i]` for the i-th of a list."""
        return name if self.index is None else f"{name}[{self.index}]"


def question_list(questions, max_questions: int | None = None, max_chars: int | None = None,
                  at_least_one: bool = False) -> list[str]:
    """Questions as a list of non-empty strings; a single string is one question (not one per character). With
    `at_least_one`, `max_questions` and `max_chars` (a server's limits), an empty list, more questions or a longer
    question is refused too."""
    one = isinstance(questions, str)
    if one:
        questions = [questions]
    try:
        questions = list(questions)
    except TypeError:
        raise QuestionError(None, f"expected a string or a list of strings, got {type(questions).__name__}") from None
    if at_least_one and not questions:
        raise QuestionError(None, "no question given")
    if max_questions is not None and len(questions) > max_questions:
        raise QuestionError(None, f"{len(questions)} questions in one request; at most {max_questions}", 413)
    for i, q in enumerate(questions):
        where = None if one else i
        if not isinstance(q, str):
            raise QuestionError(where, f"expected a non-empty string, got {type(q).__name__}")
        if not q.strip():
            raise QuestionError(where, f"expected a non-empty string, got {q[:20]!r}")
        if max_chars is not None and len(q) > max_chars:
            raise QuestionError(where, f"{len(q)} characters; at most {max_chars}")
        try:
            q.encode("utf-8")
        except UnicodeEncodeError as err:
            raise QuestionError(where, f"not text: character {err.start} is a lone surrogate "
                                       f"({q[err.start].encode('utf-8', 'backslashreplace').decode()})") from None
    return questions
