"""veil: private aggregation with differentially private output.

Clients secret-share their measurements with Prio3 (draft-irtf-cfrg-vdaf)
between two aggregators, which verify the validity proofs jointly, sum the
valid shares and each add differential-privacy noise before anything leaves
them. See the README for status and usage.
"""

__version__ = "0.1.0"
