# sandboxd, the node daemon. Built by `make images` (hack/images.sh) from the local base image and
# the binary cargo built on the host; no compiler and no registry in the build.
# Root inside: it holds the node's Docker socket, hands workspaces to the sandbox uid and
# installs the sandbox network's iptables rules (without workspace disks the chart drops every
# capability but CHOWN, DAC_OVERRIDE, FOWNER, SETUID, SETGID, NET_ADMIN and NET_RAW).
ARG BASE_IMAGE=sandboxd-base:bookworm-1
FROM ${BASE_IMAGE}
ARG VERSION
LABEL org.opencontainers.image.title="sandboxd" \
      org.opencontainers.image.description="The sandboxd node daemon: sandbox sessions in sibling containers with persistent workspaces" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# iptables and ca-certificates (and their libraries), downloaded on the host by hack/images.sh:
# sandboxd fences in the network of sandboxes whose runtime needs one, and its egress proxy
# verifies upstream servers against the system roots (SANDBOXD_EGRESS_SYSTEM_ROOTS).
COPY debs/ /tmp/debs/
RUN dpkg -i /tmp/debs/*.deb && rm -rf /tmp/debs && iptables -V \
 && grep -q 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt
COPY sandboxd /usr/local/bin/sandboxd
ENV SANDBOXD_HOST=0.0.0.0 \
    DOCKER_HOST=unix:///var/run/docker.sock
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/sandboxd"]
