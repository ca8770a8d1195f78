"""Target registry: per-CPU choices made for the host target."""
import pytest

from edgellm.targets import get_target, registry


@pytest.mark.parametrize("intel, flags, expect", [
    (False, ("avx2", "fma", "f16c"), (1024, 1024)),                          # Zen 1-3: the short distances
    (False, ("avx2", "fma", "f16c", "avx512f", "avx512vnni"), (4096, 8192)),  # Zen 4/5
    (True, ("avx2", "fma", "f16c"), (4096, 8192)),
    (True, ("avx2", "fma", "f16c", "avx512f", "avx512vnni"), (4096, 8192)),
])
def test_decode_prefetch_distance_follows_the_cpu(monkeypatch, intel, flags, expect):
    monkeypatch.setattr(registry, "host_is_intel", lambda: intel)
    monkeypatch.setattr(registry, "_host_x86_features", lambda: flags)
    assert tuple(registry.host_prefetch().values()) == expect
    if registry.platform.machine() in ("x86_64", "AMD64"):
        host = get_target("host")
        assert (host.prefetch_bytes, host.float_prefetch_bytes) == expect
    for name, pf in (("x86-avx2", (1024, 1024)), ("x86-avx512", (4096, 8192))):
        t = get_target(name)
        assert (t.prefetch_bytes, t.float_prefetch_bytes) == pf


def test_every_host_feature_list_fits_the_plan_header():
    """A CPU with every feature the host target lists (Sapphire Rapids and later) must still compile: the list goes
    into plan.bin's fixed-size features field."""
    from edgellm.runtime import contract as K

    size = int(dict(K.HEADER.fields)["features"][:-1])
    assert len(",".join(registry._X86_FEATURES.values()).encode()) < size   # a NUL ends it
