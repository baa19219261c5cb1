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
checks the code, records the invitation as used with a hash of the blinded
messages while it signs them, and answers only once that is committed: a
crash before the commit leaves the invitation unused, a failure while
signing undoes the burn, and a retry with the same blinded messages after
the commit gets the same signatures (blind RSA signing is deterministic), so
an answer lost on the way, or never made because the issuer stopped, is not
a lost invitation; any other request for a used invitation is refused. The
issuer never sees a token: it signs blinded messages, so it cannot link an
invitation to a report.
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
from dataclasses import dataclass, field
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
    # The committer's connection passes from one committer thread to the
    # next (one at a time).
    db = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
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


# The changes a redemption asks of its invitation, each decided in a group commit.
_BURN = "burn"  # before signing: burn it for these blinded messages
_RECORD = "record"  # signatures in hand: burn it if still unused, and keep them
_RELEASE = "release"  # signing failed after this redemption's burn: undo the burn

COMMITTER_IDLE = 1.0  # seconds the committer thread waits for work before it ends


@dataclass
class _Change:
    """One redemption's change to its invitation, waiting for a group commit;
    the commit that decides it sets `burned` (a _BURN that burned the
    invitation), `answer` (a _RECORD's signatures to answer with) or `error`,
    then `done`."""

    kind: str
    key: bytes
    request: bytes
    sigs: list[bytes] | None = None
    burned: bool = False
    answer: list[bytes] | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def decided(self) -> _Change:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self


class Issuer:
    """Redeems invitations of one deployment (thread-safe).

    A redemption reads the invitation (unknown: refused; used: for the same
    blinded messages the signatures again, else refused), hands the burn of
    an unused one to the committer thread, and signs while that burn is
    written (the OpenSSL calls release the GIL, so concurrent redemptions
    sign on every core, and the fsync overlaps the signing). The committer
    takes every change waiting and writes them in one transaction, one
    fsync for all, reading each invitation again there: a concurrent
    redemption that burnt it first for other blinded messages leaves this
    one refused, its signatures dropped unseen. An answer leaves only after
    the COMMIT of its burn, so a power loss cannot un-burn an invitation that
    was signed for, and one set of signatures per invitation ever leaves the
    issuer (blind RSA signing is deterministic: the same blinded messages
    always get the same signatures).

    A burn is kept with the hash of its blinded messages, and the signatures
    only once a second redemption of them answered (a retry, or two at once:
    it signs again, and records the signatures before answering). A
    redemption whose signing fails after its burn undoes the burn unless a
    retry of it has answered, so a failure while signing uses nothing; if
    the issuer stops before that, the invitation stays used for those blinded
    messages, and the same request gets the signatures (the respondent's
    client sends the same request again when an answer is lost).

    Connections are one per thread, and the committer's one per issuer,
    kept open (closing the last one checkpoints the WAL into the database
    file, another fsync)."""

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
        self._changes = threading.Condition()
        self._queue: list[_Change] = []
        self._committing = False
        self._commit_db: sqlite3.Connection | None = None

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
        try:
            for s, b in zip(self.signers, blinded, strict=True):
                s.check(b)
        except blindrsa.BlindRSAError as e:
            raise IssuerError(f"a blinded message is invalid: {e}") from None
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
            if not secrets.compare_digest(row[1], request):
                raise InvitationUsed(USED_MESSAGE)
            if row[2] is not None:
                return _split(row[2])
            return self._record(key, request, self._sign(blinded))
        burn = self._submit(_Change(_BURN, key, request))
        try:
            sigs = self._sign(blinded)
        except BaseException:
            burn.done.wait()
            if burn.burned:
                self._release(burn)
            raise
        if burn.decided().burned:
            return sigs
        # Burnt for the same blinded messages by a redemption still under way.
        return self._record(key, request, sigs)

    def _sign(self, blinded: Sequence[bytes]) -> list[bytes]:
        try:
            return [s.blind_sign(b) for s, b in zip(self.signers, blinded, strict=True)]
        except blindrsa.BlindRSAError as e:
            raise IssuerError(f"a blinded message is invalid: {e}") from None

    def _record(self, key: bytes, request: bytes, sigs: list[bytes]) -> list[bytes]:
        answer = self._submit(_Change(_RECORD, key, request, sigs)).decided().answer
        assert answer is not None
        return answer

    def _release(self, burn: _Change) -> None:
        release = self._submit(_Change(_RELEASE, burn.key, burn.request))
        release.done.wait()
        if release.error is not None:
            _log.error(
                "an invitation whose signing failed stays used (the same request is answered): %s",
                release.error,
            )

    def _submit(self, change: _Change) -> _Change:
        """Queues `change` for the committer thread, started if none runs."""
        with self._changes:
            self._queue.append(change)
            if self._committing:
                self._changes.notify()
                return change
            self._committing = True
            try:
                threading.Thread(
                    target=self._commit_loop, name="veil-issuer-commit", daemon=True
                ).start()
            except RuntimeError:
                self._committing = False
                self._queue.remove(change)
                _log.error("the issuer could not start its committer thread")
                raise IssuerUnavailable(UNAVAILABLE_MESSAGE) from None
        return change

    def _commit_loop(self) -> None:
        """Commits what is queued, a batch a transaction, until nothing has
        come for COMMITTER_IDLE seconds."""
        while True:
            with self._changes:
                if not self._queue:
                    self._changes.wait(COMMITTER_IDLE)
                if not self._queue:
                    self._committing = False
                    return
                batch, self._queue = self._queue, []
            try:
                self._commit(batch)
            except BaseException:  # a bug: no redemption waits for ever
                _log.exception("the issuer's committer failed")
                for change in batch:
                    if not change.done.is_set():
                        change.error = IssuerUnavailable(UNAVAILABLE_MESSAGE)
                        change.done.set()

    def _commit(self, batch: list[_Change]) -> None:
        """Applies every change of `batch` in one transaction and decides
        each: all get the error if the commit fails."""
        try:
            if self._commit_db is None:
                self._commit_db = _connect(self.db_path)
            db = self._commit_db
            db.execute("BEGIN IMMEDIATE")
            decisions = _apply(db, batch, time.time())
            db.execute("COMMIT")
        except BaseException as e:
            failure: BaseException = e
            opened = self._commit_db
            if opened is not None:
                with contextlib.suppress(sqlite3.Error):
                    if opened.in_transaction:
                        opened.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                _log.error("the issuer could not record %d redemption(s): %s", len(batch), e)
                failure = IssuerUnavailable(UNAVAILABLE_MESSAGE)
                # Opened again next time: one opened while the file could
                # not be written stays read-only.
                if opened is not None:
                    opened.close()
                self._commit_db = None
            for change in batch:
                change.error = failure
                change.done.set()
            return
        for change, (burned, answer, error) in zip(batch, decisions, strict=True):
            change.burned, change.answer, change.error = burned, answer, error
            change.done.set()


_Decision = tuple[bool, list[bytes] | None, IssuerError | None]  # burned, answer, error
_Row = list[object]  # used, request_hash, signatures


def _apply(db: sqlite3.Connection, batch: list[_Change], now: float) -> list[_Decision]:
    """The changes of `batch` applied in order inside the committer's
    transaction, with one read of their invitations and one write of those
    that change (each statement a wait for the GIL, which the signing
    threads hold by turns); a decision per change."""
    keys = list(dict.fromkeys(c.key for c in batch))
    rows: dict[bytes, _Row] = {}
    for i in range(0, len(keys), 500):  # well under SQLite's limit on parameters
        part = keys[i : i + 500]
        found = db.execute(
            "SELECT code_hash, used, request_hash, signatures FROM invitations"
            f" WHERE code_hash IN ({', '.join('?' * len(part))})",
            part,
        ).fetchall()
        rows.update((r[0], list(r[1:])) for r in found)
    changed: dict[bytes, _Row] = {}
    decisions = []
    for change in batch:
        row = rows.get(change.key)
        decision, write = (
            ((False, None, UnknownInvitation(UNKNOWN_MESSAGE)), False)
            if row is None
            else _decide(row, change, now)
        )
        decisions.append(decision)
        if write and row is not None:
            changed[change.key] = row
    if changed:
        db.executemany(
            "UPDATE invitations SET used = ?, request_hash = ?, signatures = ? WHERE code_hash = ?",
            [(*row, key) for key, row in changed.items()],
        )
    return decisions


def _decide(row: _Row, change: _Change, now: float) -> tuple[_Decision, bool]:
    """`change` applied to its invitation's `row` (changed in place): its
    decision, and whether the row changed."""
    used, stored_request, stored = row
    if change.kind == _RELEASE:
        # Not if a retry of the same blinded messages recorded (and so
        # answered) its signatures meanwhile.
        mine = (
            used is not None
            and stored is None
            and isinstance(stored_request, bytes)
            and secrets.compare_digest(stored_request, change.request)
        )
        if mine:
            row[:] = [None, None, None]
        return (False, None, None), mine
    if used is None:
        row[:] = [now, change.request, None if change.sigs is None else b"".join(change.sigs)]
        return (True, change.sigs, None), True
    assert isinstance(stored_request, bytes)
    if not secrets.compare_digest(stored_request, change.request):
        return (False, None, InvitationUsed(USED_MESSAGE)), False
    if change.kind == _BURN:
        return (False, None, None), False
    if stored is None:
        assert change.sigs is not None
        row[2] = b"".join(change.sigs)
        return (False, change.sigs, None), True
    assert isinstance(stored, bytes)
    return (False, _split(stored), None), False


def _split(joined: bytes) -> list[bytes]:
    k = blindrsa.K_LEN
    return [joined[i : i + k] for i in range(0, len(joined), k)]
