"""Link shaping: pure plans and the backends (netem, nfqueue) that apply them to container namespaces."""
