"""`veil survey serve`: the survey's web page for respondents in a browser.

The page (rendered by `veil.web.page`) carries a script, the JavaScript Prio3
client of js/ bundled into `static/veil-survey.js`, that shards and seals
every answer on the respondent's device. The server (`veil.web.app`) sends the
page, the public survey description and each aggregator's HPKE config, and
forwards the sealed reports it is posted to the leader's UploadReports over
gRPC. It sees what the leader sees, never an answer.
"""

from veil.web.app import ServeError, ServeLimits, SurveySite, build_app

__all__ = ["ServeError", "ServeLimits", "SurveySite", "build_app"]
