"""The survey page: HTML with no logic beyond presentation.

Every question is a fieldset whose legend is the question's text, with one
labelled control per option or number, so screen readers announce the
question with each control and the page works from the keyboard alone. A
points question adds its running total, which the script keeps in a polite
live region. Error
messages sit in each question's `role=alert` paragraph, filled by the script.
The page loads one stylesheet and one script, both from this server and both
pinned by Subresource Integrity; nothing else is fetched.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape

from veil.survey import Question, Survey
from veil.survey.statement import privacy_statement, public_sentences


def _attr(text: str) -> str:
    return escape(text, quote=True)


def _error(q: Question) -> str:
    return f'<p class="error" id="err-{_attr(q.id)}" role="alert" hidden></p>'


def _choice(q: Question, kind: str) -> str:
    items = []
    for i, option in enumerate(q.options):
        cid = f"a-{q.id}-{i}"
        items.append(
            f'<label class="option" for="{_attr(cid)}"><input type="{kind}" id="{_attr(cid)}"'
            f' name="{_attr(q.id)}" value="{_attr(option)}" data-index="{i}"'
            f' aria-describedby="err-{_attr(q.id)}"> {escape(option)}</label>'
        )
    return "".join(items)


def _number(q: Question, cid: str, label: str) -> str:
    return (
        f'<label class="number" for="{_attr(cid)}">{escape(label)}'
        f' <input type="text" inputmode="numeric" pattern="[0-9]*" autocomplete="off"'
        f' id="{_attr(cid)}" name="{_attr(q.id)}" aria-describedby="hint-{_attr(q.id)}'
        f' err-{_attr(q.id)}"></label>'
    )


def _points(q: Question) -> str:
    """One number per option, and the running total, which the script keeps (a polite
    live region: a screen reader hears it change without losing its place)."""
    inputs = "".join(
        f'<label class="number" for="a-{_attr(q.id)}-{i}">{escape(option)}'
        f' <input type="text" inputmode="numeric" pattern="[0-9]*" autocomplete="off"'
        f' id="a-{_attr(q.id)}-{i}" name="{_attr(q.id)}" data-index="{i}"'
        f' aria-describedby="hint-{_attr(q.id)} total-{_attr(q.id)} err-{_attr(q.id)}"></label>'
        for i, option in enumerate(q.options)
    )
    return (
        f'{inputs}<p class="points-total" id="total-{_attr(q.id)}" aria-live="polite"'
        f' data-total="{q.total}">0 of {q.total} points given.</p>'
    )


def _question(q: Question) -> str:
    if q.kind == "yes_no":
        body = "".join(
            f'<label class="option" for="a-{_attr(q.id)}-{value}"><input type="radio"'
            f' id="a-{_attr(q.id)}-{value}" name="{_attr(q.id)}" value="{value}"'
            f' aria-describedby="err-{_attr(q.id)}"> {label}</label>'
            for value, label in (("yes", "Yes"), ("no", "No"))
        )
        hint = ""
    elif q.kind == "choice":
        body, hint = _choice(q, "radio"), "Choose one."
    elif q.kind == "multi_choice":
        body, hint = _choice(q, "checkbox"), f"Choose up to {q.max_choices}."
    elif q.kind == "integer":
        body = _number(q, f"a-{q.id}", "Your answer")
        hint = f"A whole number from 0 to {q.max}."
    elif q.kind == "points":
        body = _points(q)
        hint = (
            f"Split up to {q.total} points across the options, in whole numbers; an option"
            " left empty gets none."
        )
    elif q.kind == "text":
        cid = f"a-{q.id}"
        body = (
            f'<label class="text" for="{_attr(cid)}">Your answer <input type="text"'
            f' autocomplete="off" spellcheck="false" id="{_attr(cid)}" name="{_attr(q.id)}"'
            f' aria-describedby="hint-{_attr(q.id)} err-{_attr(q.id)}"></label>'
        )
        case = "" if q.case_sensitive else ", counted in lower case"
        hint = (
            f"A short answer: at most {q.max_bytes} bytes (a letter outside A to Z may take"
            f" 2 to 4){case}. Only answers many people give are published."
        )
    else:
        labels = q.labels or tuple(f"Number {i + 1}" for i in range(q.length))
        body = "".join(_number(q, f"a-{q.id}-{i}", label) for i, label in enumerate(labels))
        hint = f"Whole numbers from 0 to {q.max}."
    if q.required:
        hint += " An answer is needed."
    if q.local_epsilon is not None:
        # The respondent should know: the answer sent may not be the answer given.
        hint += (
            " This device randomizes the answer before sending it, so that nobody can"
            " be sure of what you answered."
        )
    hint_html = (
        f'<p class="hint" id="hint-{_attr(q.id)}">{escape(hint.strip())}</p>' if hint else ""
    )
    return (
        f'<fieldset class="question" id="q-{_attr(q.id)}" data-kind="{_attr(q.kind)}"'
        f"{' data-required' if q.required else ''}>"
        f"<legend>{escape(q.text)}</legend>{hint_html}{body}{_error(q)}</fieldset>"
    )


def render_page(survey: Survey, script_integrity: str, style_integrity: str) -> str:
    """The whole page. Integrity values are ``sha384-<base64>`` of the served files."""
    closes = ""
    if survey.closes is not None:
        # The page is rendered once, when the server starts, possibly before the
        # window opens: it states both ends, never "open" on its own.
        def when(t: int) -> str:
            return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")

        if survey.opens is not None:
            closes = f" Open from {when(survey.opens)} until {when(survey.closes)}."
        else:
            closes = f" Open until {when(survey.closes)}."
    what, who, unit = public_sentences(survey)
    exact = "".join(f"<p>{escape(line)}</p>" for line in privacy_statement(survey).lines())
    # The window in milliseconds for the script: before it opens and after it
    # closes the form is disabled and says when, in the respondent's own time.
    window = "".join(
        f' data-{name}="{t * 1000}"'
        for name, t in (("opens", survey.opens), ("closes", survey.closes))
        if t is not None
    )
    # By invitation: the script disables the form at once when the link has no code.
    if survey.invitations:
        window += " data-invitations"
    questions = "".join(_question(q) for q in survey.questions)
    # By invitation: the script shows the issuer keys' fingerprint here, to hold
    # against the one the survey published.
    keys = '<p id="issuer-keys" class="keys" hidden></p>\n' if survey.invitations else ""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(survey.name)}</title>
<link rel="icon" href="static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="static/survey.css" integrity="{style_integrity}">
<script src="static/veil-survey.js" integrity="{script_integrity}" defer></script>
</head>
<body>
<main>
<h1>{escape(survey.name)}</h1>
<div class="about">
<p>{escape(what)}</p>
<p>{escape(who)} This web server cannot read them either, as long as it serves the
genuine survey script.</p>
<p>{escape(unit)}{escape(closes)} A question you leave unanswered is not sent, unless it
says an answer is needed.</p>
<details><summary>The exact privacy statement, for auditors</summary>{exact}</details>
</div>
<noscript><p class="error">This survey needs JavaScript: your answers are encrypted
on your device before they leave it.</p></noscript>
<form id="survey" novalidate{window}>
{questions}
<button type="submit">Send my answers</button>
<p id="status" role="status" aria-live="polite"></p>
{keys}</form>
</main>
</body>
</html>
"""
