from tests.oci.conftest import busybox_base, client, make_cache, registry  # noqa: F401
