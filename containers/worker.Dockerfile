# The Squall worker image. Built by `squall image build` (squall/cluster/image.py) with a
# context holding this file, requirements.txt and wheels/ (downloaded on the host beforehand):
# nothing is fetched from inside the build. The project's code is NOT in the image: it is
# mounted read-only at /squall/src, so editing a protocol needs no rebuild.
ARG BASE
FROM ${BASE}
COPY requirements.txt /tmp/squall-requirements.txt
COPY wheels /tmp/squall-wheels
# The workers run on CPUs: an nvidia or triton package here means a CUDA torch, and the build stops.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/squall-wheels \
        -r /tmp/squall-requirements.txt \
 && if /opt/venv/bin/pip list --format=freeze | grep -iE '^(nvidia-|triton==)'; then \
        echo "squall: CUDA packages in the worker image (above): use torch's CPU build" >&2; exit 1; fi \
 && rm -rf /tmp/squall-wheels /tmp/squall-requirements.txt /root/.cache
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/squall/src \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    OMP_NUM_THREADS=1 \
    HOME=/tmp
WORKDIR /squall
LABEL squall.image=worker
