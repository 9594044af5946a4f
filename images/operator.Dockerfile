# sandbox-operator, the controllers. Built by `make images` (hack/images.sh) from the local base
# image and the binary cargo built on the host. Runs as a non-root user.
ARG BASE_IMAGE=sandboxd-base:bookworm-1
FROM ${BASE_IMAGE}
ARG VERSION
LABEL org.opencontainers.image.title="sandbox-operator" \
      org.opencontainers.image.description="The sandboxd operator: SandboxHost, Runtime, SandboxSession and Tombstone controllers" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY sandbox-operator /usr/local/bin/sandbox-operator
USER 65532:65532
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/sandbox-operator"]
