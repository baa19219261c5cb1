"""The invitation issuer: mints invitation codes, then burns one and blind-
signs one token per question for it; the burns of concurrent redemptions
are committed together, one SQLite transaction.

Files, in a deployment's issuer/ directory (written by `veil survey deploy`
for a survey with `invitations = true`, readable by its owner only):

    keys.pem       one RSA-2048 private key per question, in question order
    issuer.db      the invitations (created by `veil survey invite`)

An invitation is stored as the SHA-256 of its code, never the code: a copy
of the database does not hand out invitations. Codes are 128 random bits
(`secrets`), so the hash cannot be reversed by trying codes. Redeeming
checks the code, signs, and records the invitation as used with a hash of
the blinded messages and the blind signatures, and answers only once that
is committed: a crash before the commit leaves the invitation unused (the
respondent tries again), and a retry with the same blinded messages after the commit gets the
same signatures back (the answer was lost on the way), while any other
request for a used invitation is refused. The issuer never sees a token: it
signs blinded messages, so it cannot link an invitation to a report.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from veil.files import create_file
from veil.invite import blindrsa

_log = logging.getLogger(__name__)

KEYS_FILE = "keys.pem"
DB_FILE = "issuer.db"
CODE_BYTES = 16
USED_MESSAGE = "This invitation has already been used."
UNKNOWN_MESSAGE = "This invitation is not valid: check the link or code you were given."


class IssuerError(ValueError):
    """A redemption refused; `status` is the HTTP status to answer with."""

    status = 400


class UnknownInvitation(IssuerError):
    status = 403


class InvitationUsed(IssuerError):
    status = 403


class IssuerUnavailable(IssuerError):
    """The issuer could not record a burn (its database refused the write):
    nothing was used, and the same request may be sent again."""

    status = 503


UNAVAILABLE_MESSAGE = (
    "the issuer could not record the invitation; it was not used: try again in a moment"
)


def new_code() -> str:
    """A fresh invitation code: 128 random bits, URL-safe (22 characters),
    never starting with "-" (`--invitation -x...` would read as an option)."""
    while (code := secrets.token_urlsafe(CODE_BYTES)).startswith("-"):
        pass
    return code


def code_hash(code: str) -> bytes:
    return hashlib.sha256(b"veil-invitation-v1\x00" + code.encode()).digest()


def write_keys(directory: Path, keys: Sequence[rsa.RSAPrivateKey]) -> None:
    """The issuer's private keys, one per question in order, in a new 0600 file."""
    pem = b"".join(
        k.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        for k in keys
    )
    create_file(directory / KEYS_FILE, pem, 0o600)


def read_keys(directory: Path) -> list[rsa.RSAPrivateKey]:
    """The keys `write_keys` wrote; raises IssuerError naming the file."""
    path = directory / KEYS_FILE
    try:
        text = path.read_bytes()
    except OSError as e:
        raise IssuerError(
            f"{path}: cannot read the issuer's keys ({e.strerror}); give the issuer/ directory"
            " `veil survey deploy` wrote for a survey with invitations"
        ) from None
    marker = b"-----END PRIVATE KEY-----"
    keys = []
    for block in text.split(marker)[:-1]:
        key = serialization.load_pem_private_key(block + marker, password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise IssuerError(f"{path}: not an RSA key")
        if key.key_size != blindrsa.MODULUS_BITS:
            raise IssuerError(
                f"{path}: an RSA-{key.key_size} key; tokens are signed with"
                f" RSA-{blindrsa.MODULUS_BITS} keys"
            )
        keys.append(key)
    if not keys:
        raise IssuerError(f"{path}: holds no key")
    return keys


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS invitations (code_hash BLOB PRIMARY KEY,"
        " created REAL NOT NULL, used REAL, request_hash BLOB, signatures BLOB)"
    )
    return db


def _ensure_db(directory: Path) -> Path:
    """The invitations database, created empty (0600) if missing: codes may
    be minted while the issuer runs."""
    path = directory / DB_FILE
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            create_file(path, b"", 0o600)
    _connect(path).close()
    return path


def _check_writable(path: Path) -> None:
    """Raises IssuerError unless the issuer can write its database: it burns
    every invitation it redeems there, so one that can only read would
    answer every redemption with an error. The probe rewrites the header's
    user_version with its own value (nothing stored changes)."""
    db = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        db.execute("BEGIN IMMEDIATE")
        (version,) = db.execute("PRAGMA user_version").fetchone()
        db.execute(f"PRAGMA user_version = {int(version)}")
        db.execute("COMMIT")
    except sqlite3.Error as e:
        raise IssuerError(
            f"{path}: cannot write the invitations ({e}); the issuer records there each"
            " invitation it redeems: give it write access to the file and its directory"
        ) from None
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")
        db.close()


def mint(directory: Path, count: int) -> list[str]:
    """`count` new invitation codes, stored hashed in one transaction."""
    if count < 1:
        raise IssuerError("--count must be at least 1")
    path = _ensure_db(directory)
    codes = [new_code() for _ in range(count)]
    db = _connect(path)
    try:
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO invitations (code_hash, created) VALUES (?, ?)",
            [(code_hash(c), now) for c in codes],
        )
        db.execute("COMMIT")
    finally:
        db.close()
    return codes


@dataclass(frozen=True)
class Counts:
    minted: int
    used: int


@dataclass
class _Burn:
    """One redemption waiting for a group commit: the invitation, the hash of
    its blinded messages and the signatures made for them; `answer` or
    `error` is set by the commit that decided it."""

    key: bytes
    request: bytes
    sigs: list[bytes]
    answer: list[bytes] | None = None
    error: BaseException | None = None
    done: bool = False


class Issuer:
    """Redeems invitations of one deployment (thread-safe).

    A redemption reads the invitation (unknown: refused; used: the stored
    signatures for the same blinded messages, else refused), signs outside
    any lock (the OpenSSL calls release the GIL, so concurrent redemptions
    sign on every core), then waits for a group commit: one thread at a time
    takes every burn waiting and writes them in one transaction, one fsync
    for all. In that transaction each invitation is read again: if a
    concurrent redemption burnt it first, this one's signatures are dropped
    unseen and it gets the stored ones (same blinded messages) or "already
    used" (other messages). An answer leaves only after its COMMIT, so a
    power loss cannot un-burn an invitation that was signed for, and one set
    of signatures per invitation ever leaves the issuer.

    Connections are one per thread, kept open (closing the last one
    checkpoints the WAL into the database file, another fsync)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.signers = [blindrsa.Signer(k) for k in read_keys(self.directory)]
        try:
            self.db_path = _ensure_db(self.directory)
        except sqlite3.Error as e:
            raise IssuerError(
                f"{self.directory / DB_FILE}: cannot open the invitations ({e})"
            ) from None
        _check_writable(self.db_path)
        self._local = threading.local()
        self._pending: list[_Burn] = []
        self._pending_lock = threading.Lock()
        self._writer = threading.Lock()

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = _connect(self.db_path)
        return db

    def counts(self) -> Counts:
        db = _connect(self.db_path)
        try:
            minted, used = db.execute("SELECT COUNT(*), COUNT(used) FROM invitations").fetchone()
        finally:
            db.close()
        return Counts(minted, used)

    def redeem(self, code: str, blinded: Sequence[bytes]) -> list[bytes]:
        """The blind signatures, one per question; raises IssuerError."""
        if not isinstance(code, str) or not 1 <= len(code) <= 64:
            raise UnknownInvitation(UNKNOWN_MESSAGE)
        if len(blinded) != len(self.signers):
            raise IssuerError(
                f"send one blinded message per question: {len(self.signers)}, not {len(blinded)}"
            )
        for i, b in enumerate(blinded):
            if len(b) != blindrsa.K_LEN:
                raise IssuerError(f"blinded message {i} must be {blindrsa.K_LEN} bytes")
        key = code_hash(code)
        request = hashlib.sha256(b"".join(blinded)).digest()
        select = "SELECT used, request_hash, signatures FROM invitations WHERE code_hash = ?"
        try:
            row = self._db().execute(select, (key,)).fetchone()
        except sqlite3.Error as e:
            _log.error("the issuer could not read its invitations: %s", e)
            raise IssuerUnavailable(UNAVAILABLE_MESSAGE) from None
        if row is None:
            raise UnknownInvitation(UNKNOWN_MESSAGE)
        if row[0] is not None:
            return _stored_answer(row, request)
        try:
            sigs = [s.blind_sign(b) for s, b in zip(self.signers, blinded, strict=True)]
        except blindrsa.BlindRSAError as e:
            raise IssuerError(f"a blinded message is invalid: {e}") from None
        return self._burn(_Burn(key, request, sigs))

    def _burn(self, burn: _Burn) -> list[bytes]:
        """Waits for the group commit that decides `burn`; its answer."""
        with self._pending_lock:
            self._pending.append(burn)
        with self._writer:
            if not burn.done:
                with self._pending_lock:
                    batch, self._pending = self._pending, []
                self._commit(batch)
        if burn.error is not None:
            raise burn.error
        assert burn.answer is not None
        return burn.answer

    def _commit(self, batch: list[_Burn]) -> None:
        """Burns every invitation of `batch` still unused, in one transaction,
        and decides every burn: all get the error if the commit fails."""
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            now = time.time()
            answers: list[tuple[list[bytes] | None, IssuerError | None]] = []
            for burn in batch:
                row = db.execute(
                    "SELECT used, request_hash, signatures FROM invitations WHERE code_hash = ?",
                    (burn.key,),
                ).fetchone()
                if row is None:
                    answers.append((None, UnknownInvitation(UNKNOWN_MESSAGE)))
                elif row[0] is None:
                    db.execute(
                        "UPDATE invitations SET used = ?, request_hash = ?, signatures = ?"
                        " WHERE code_hash = ?",
                        (now, burn.request, b"".join(burn.sigs), burn.key),
                    )
                    answers.append((burn.sigs, None))
                else:
                    try:
                        answers.append((_stored_answer(row, burn.request), None))
                    except InvitationUsed as e:
                        answers.append((None, e))
            db.execute("COMMIT")
        except BaseException as e:
            if db.in_transaction:
                db.execute("ROLLBACK")
            failure: BaseException = e
            if isinstance(e, sqlite3.Error):
                _log.error("the issuer could not record %d redemption(s): %s", len(batch), e)
                failure = IssuerUnavailable(UNAVAILABLE_MESSAGE)
            for burn in batch:
                burn.error, burn.done = failure, True
            return
        for burn, (answer, error) in zip(batch, answers, strict=True):
            burn.answer, burn.error, burn.done = answer, error, True


def _stored_answer(row: tuple[object, bytes, bytes], request: bytes) -> list[bytes]:
    """The stored signatures of a used invitation for the same blinded
    messages; InvitationUsed for any other."""
    _, stored_request, stored = row
    if secrets.compare_digest(stored_request, request):
        return _split(stored)
    raise InvitationUsed(USED_MESSAGE)


def _split(joined: bytes) -> list[bytes]:
    k = blindrsa.K_LEN
    return [joined[i : i + k] for i in range(0, len(joined), k)]
