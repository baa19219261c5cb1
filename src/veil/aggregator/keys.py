"""An aggregator's HPKE keys (read from its store, where `veil keys`
changes them) and the opening of input shares with them: the keys a job's
shares are opened with, re-read when an unknown config id appears, and the
opens spread over the opener's threads (veil.aggregator.opener), each
outcome counted in the metrics."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from veil.aggregator.errors import ReportRejection
from veil.aggregator.maintenance import active_key, ensure_active_key
from veil.aggregator.opener import OpenPool, threads_for
from veil.aggregator.store.base import Datastore
from veil.hpke import (
    ENC_SIZE,
    Ciphertext,
    HpkeConfig,
    HpkeError,
    HpkeKeypair,
    decapsulate_enc,
    open_payload,
)
from veil.metrics import Metrics

HPKE_UNKNOWN_CONFIG_ID = ReportRejection.HPKE_UNKNOWN_CONFIG_ID
HPKE_DECRYPT_ERROR = ReportRejection.HPKE_DECRYPT_ERROR
# How stale the in-memory copy of the HPKE keys may get before a config
# request or an unknown config id makes the server read them again.
KEY_REFRESH_SECONDS = 1.0


# An input share to open: its key (None: no key has its config id), the
# ciphertext's encapsulated key and payload, and the context.
_Sealed = tuple[HpkeKeypair | None, bytes, bytes | memoryview, bytes]


def _decapsulated(share: _Sealed) -> ReportRejection | bytes:
    """The first step of opening one input share: the DH output
    (veil.hpke.decapsulate_enc), or why it does not open."""
    keypair, enc, _payload, _info = share
    if keypair is None:
        return HPKE_UNKNOWN_CONFIG_ID
    try:
        return decapsulate_enc(keypair, enc)
    except HpkeError:
        return HPKE_DECRYPT_ERROR


def _open_decapsulated(share: _Sealed, dh: ReportRejection | bytes) -> ReportRejection | bytes:
    """The rest of the open from `_decapsulated`'s outcome: the plaintext,
    or why it does not open (a rejection already found is passed on)."""
    if isinstance(dh, ReportRejection):
        return dh
    keypair, enc, payload, info = share
    assert keypair is not None
    try:
        return open_payload(keypair, enc, payload, info, dh)
    except HpkeError:
        return HPKE_DECRYPT_ERROR


def tally_open(outcome: ReportRejection | bytes, tally: dict[str, int]) -> dict[str, int]:
    """Add an open's outcome to `tally` (counts by the metric's label:
    "ok" or the rejection reason); returns `tally`."""
    label = outcome.value if isinstance(outcome, ReportRejection) else "ok"
    tally[label] = tally.get(label, 0) + 1
    return tally


class KeyRing:
    """The HPKE keys of one aggregator and the opening of its input shares."""

    def __init__(
        self,
        store: Datastore,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        open_threads: int = 0,
    ) -> None:
        self.store = store
        self.metrics = metrics
        # A job's input shares are opened over these threads (veil.aggregator.
        # opener; the setting is a server's `open_threads`, 0: one per core).
        self.opener = OpenPool(threads_for(open_threads))
        # The HPKE outcome counters by label: looking a labelled child up
        # costs more than counting, once per report.
        self._open_counters: dict[str, Any] = {}
        ensure_active_key(store, clock())
        self._keys_read_at = -float("inf")
        self._keys_lock = threading.Lock()
        self.refresh_keys()

    def refresh_keys(self) -> None:
        """Re-read the key set from storage, where `veil keys` changes it."""
        keys = self.store.hpke_keys()
        current = active_key(keys) or max(keys, key=lambda k: k.created)
        # Two assignments of whole values: readers see the old or the new set.
        self.keypairs: dict[int, HpkeKeypair] = {k.config_id: k.keypair for k in keys}
        self.current_config: HpkeConfig = current.keypair.config
        self._keys_read_at = time.monotonic()

    def maybe_refresh_keys(self) -> None:
        # At most once per KEY_REFRESH_SECONDS, whatever the traffic: a flood
        # of unknown config ids costs one small query a second, no more.
        if time.monotonic() - self._keys_read_at < KEY_REFRESH_SECONDS:
            return
        if self._keys_lock.acquire(blocking=False):
            try:
                self.refresh_keys()
            finally:
                self._keys_lock.release()

    def know_keys(self, config_ids: Iterable[int]) -> None:
        """Re-read the keys now if any of `config_ids` is unknown here: before
        an aggregation job rejects a report as hpke_unknown_config_id, since
        another process may have added the key since we last looked (once per
        job, whatever the rate limit of `keypair`)."""
        if any(i not in self.keypairs for i in config_ids):
            with self._keys_lock:
                self.refresh_keys()

    def keypair(self, config_id: int) -> HpkeKeypair | None:
        """The stored key with this config id (re-reading storage if unknown)."""
        keypair = self.keypairs.get(config_id)
        if keypair is None:
            self.maybe_refresh_keys()
            keypair = self.keypairs.get(config_id)
        return keypair

    def open_share(
        self,
        keypair: HpkeKeypair | None,
        ct: Ciphertext,
        info: bytes,
        tally: dict[str, int] | None = None,
    ) -> ReportRejection | bytes:
        """Open an input share: the plaintext, or the rejection reason. Counted
        in the metrics, or with `tally` added to it by outcome, for
        `count_opens` to count once per job rather than once per share."""
        share = (keypair, ct.enc, ct.payload, info)
        outcome: ReportRejection | bytes
        if keypair is not None and keypair.config.config_id != ct.config_id:
            outcome = HPKE_DECRYPT_ERROR  # as veil.hpke.decapsulate refuses it
        else:
            outcome = _open_decapsulated(share, _decapsulated(share))
        if tally is not None:
            tally_open(outcome, tally)
        else:
            self.count_opens(tally_open(outcome, {}))
        return outcome

    def open_shares(
        self, shares: Sequence[tuple[Ciphertext, bytes]]
    ) -> list[ReportRejection | bytes]:
        """Each (ciphertext, info) of a job opened, in order: the plaintext
        or the rejection reason. Not counted: the caller adds each outcome
        it uses with `tally_open`, and counts the tally with `count_opens`.

        The X25519 of every open, which runs without the GIL, is spread over
        the opener's threads; the rest of each open (the key schedule and
        AES-GCM, which hold the GIL) follows in this thread. Threads that
        each ran whole opens would wait for the GIL at every open, and each
        wait hands it from core to core: CPU one thread never pays."""
        keypair = self.keypair
        return self._open_all(
            [(keypair(ct.config_id), ct.enc, ct.payload, info) for ct, info in shares]
        )

    def open_stored_shares(
        self, shares: Sequence[tuple[bytes, bytes]]
    ) -> list[ReportRejection | bytes]:
        """`open_shares` of ciphertexts in their stored form (`Ciphertext.
        to_bytes`: config id, encapsulated key, payload), opened in place:
        a leader's job reads thousands, and a `Ciphertext` of each, with its
        payload copied out, cost about 2 µs a report."""
        keypair = self.keypair
        e = 1 + ENC_SIZE
        return self._open_all(
            # (An empty one, which upload never stores, has no config id:
            # rejected as of an unknown config.)
            [
                (keypair(ct[0]) if ct else None, ct[1:e], memoryview(ct)[e:], info)
                for ct, info in shares
            ]
        )

    def open_shares_with_aad(
        self, shares: Sequence[tuple[Ciphertext, bytes, bytes]]
    ) -> list[ReportRejection | bytes]:
        """`open_shares` of (ciphertext, info, associated data): DAP's input
        shares, which bind their context as the AEAD's associated data."""
        keypair = self.keypair
        keyed = [(keypair(ct.config_id), ct.enc, ct.payload, info) for ct, info, _ in shares]
        dhs = self.opener.map(_decapsulated, keyed)
        out: list[ReportRejection | bytes] = []
        for (kp, enc, payload, info), dh, (_, _, aad) in zip(keyed, dhs, shares, strict=True):
            if isinstance(dh, ReportRejection):
                out.append(dh)
                continue
            assert kp is not None
            try:
                out.append(open_payload(kp, enc, payload, info, dh, aad))
            except HpkeError:
                out.append(HPKE_DECRYPT_ERROR)
        return out

    def _open_all(self, keyed: list[_Sealed]) -> list[ReportRejection | bytes]:
        dhs = self.opener.map(_decapsulated, keyed)
        return [_open_decapsulated(share, dh) for share, dh in zip(keyed, dhs, strict=True)]

    def count_opens(self, tally: dict[str, int]) -> None:
        """Count the outcomes `open_share` added to `tally` in the metrics."""
        if self.metrics is None:
            return
        for label, n in tally.items():
            counter = self._open_counters.get(label)
            if counter is None:
                counter = self._open_counters[label] = self.metrics.hpke_opens.labels(label)
            counter.inc(n)
