"""Anonymous invitations: one respondent, one answer per question, unlinkable.

Privacy Pass's publicly verifiable tokens (RFC 9578, token type 0x0002),
with blind RSA signatures (RFC 9474, RSABSSA-SHA384-PSS-Deterministic):

- `blindrsa`: the RFC 9474 operations (prepare, blind, blind_sign, finalize,
  verify), one function each with the RFC's names;
- `token`: a token's bytes, the TokenChallenge it answers, and how a report
  binds it (the challenge's redemption context is derived from the task id
  and the report id, so the aggregators' report-id uniqueness is the
  spent-token check);
- `issuer`: invitation codes, stored hashed, burnt and signed for in one
  SQLite transaction.

No well-kept blind RSA library exists for Python on PyPI, so `blindrsa`
implements the RFC's few steps itself on top of `cryptography` (keys, PSS
verification) and pycryptodome (the RSA private operation, with blinding
and CRT). The browser uses `@cloudflare/blindrsa-ts`; the tests check each
against the other.
"""
