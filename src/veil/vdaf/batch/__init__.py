"""The batched engine the servers use: many reports at once as NumPy arrays,
with compiled kernels where they earn it. Checked against ``veil.vdaf.spec``
report for report."""
