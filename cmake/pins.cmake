# The pinned versions of what the build installs (scripts/setup-deps.sh reads the same file): the one
# place to change a pin.
set(EPKIT_PIN_NVSHMEM "3.4.5")     # nvidia-nvshmem-cu13
set(EPKIT_PIN_CUTLASS "4.2.0.0")   # nvidia-cutlass (headers)
set(EPKIT_PIN_NANOBIND "2.9.2")    # nanobind (the Python extension)
