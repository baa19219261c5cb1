"""veil.render: survey results and plans for a reader: `text` (the terminal's
tables and the demo's JSON), `plots` (PNG figures; matplotlib, the `plots`
extra) and `html` (report.html, one page that works offline). Each reads
`veil.survey.results.QuestionResult` and only formats."""
