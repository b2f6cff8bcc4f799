"""The QA system: retrieve, then read (utils.system.pipeline), with one rule for answering from several passages
(utils.system.answer).

    from utils.system import QASystem
"""

from utils.system.pipeline import QASystem

__all__ = ["QASystem"]
