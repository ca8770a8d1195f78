"""Target registry: per-CPU choices made for the host target."""
import pytest

from edgellm.targets import get_target, registry


# (GEMV distance, f32/f16 GEMV distance, GEMV locality, small-batch GEMM locality, decode attention K/V locality)
@pytest.mark.parametrize("intel, flags, expect", [
    (False, ("avx2", "fma", "f16c"), (1024, 1024, 3, 2, 2)),                          # Zen 1-3: the short distances
    (False, ("avx2", "fma", "f16c", "avx512f", "avx512vnni"), (4096, 8192, 3, 2, 2)),  # Zen 4/5
    (True, ("avx2", "fma", "f16c"), (4096, 8192, 2, 2, 3)),                            # Intel: the stream into L2
    (True, ("avx2", "fma", "f16c", "avx512f", "avx512vnni"), (4096, 8192, 2, 2, 3)),
])
def test_decode_prefetch_distance_follows_the_cpu(monkeypatch, intel, flags, expect):
    keys = ("prefetch_bytes", "float_prefetch_bytes", "prefetch_locality", "batch_prefetch_locality",
            "kv_prefetch_locality")
    monkeypatch.setattr(registry, "host_is_intel", lambda: intel)
    monkeypatch.setattr(registry, "_host_x86_features", lambda: flags)
    pf = registry.host_prefetch()
    assert tuple(pf[k] for k in keys) == expect
    if registry.platform.machine() in ("x86_64", "AMD64"):
        host = get_target("host")
        assert tuple(getattr(host, k) for k in keys) == expect
    for name, pf in (("x86-avx2", (1024, 1024, 3, 3, 3)), ("x86-avx512", (4096, 8192, 3, 3, 3))):
        t = get_target(name)
        assert tuple(getattr(t, k) for k in keys) == pf


def test_every_host_feature_list_fits_the_plan_header():
    """A CPU with every feature the host target lists (Sapphire Rapids and later) must still compile: the list goes
    into plan.bin's fixed-size features field."""
    from edgellm.runtime import contract as K

    size = int(dict(K.HEADER.fields)["features"][:-1])
    assert len(",".join(registry._X86_FEATURES.values()).encode()) < size   # a NUL ends it
