"""veil.survey: several questions over the same respondents, one task each.

The package's modules, in the order a survey goes through them:
`model` (the survey and its questions, an answer as a measurement), `parse`
(the survey file, strict TOML with file:line errors), `budget` (the total
budget divided among the questions), `tasks` (one task per question),
`statement` (the privacy statement), `plan` (the accuracy to expect before
fielding it), `description` (``survey.json``, what respondents see),
`results` (a collected question's published result, computed once); `text`
holds what text questions add. Answering a deployed survey is
`veil.client.SurveyClient`; showing results is `veil.render`.

The names below are the ones an application needs; the others live in the
module that says what they are.
"""

from veil.survey.answers import AnswerError
from veil.survey.description import (
    DESCRIPTION_FILE,
    Description,
    load_description,
    public_description,
)
from veil.survey.model import (
    DEFAULT_TARGET_ERROR,
    KINDS,
    Question,
    Survey,
    SurveyError,
)
from veil.survey.parse import load_survey, parse_survey

__all__ = [
    "DEFAULT_TARGET_ERROR",
    "DESCRIPTION_FILE",
    "KINDS",
    "AnswerError",
    "Description",
    "Question",
    "Survey",
    "SurveyError",
    "load_description",
    "load_survey",
    "parse_survey",
    "public_description",
]
