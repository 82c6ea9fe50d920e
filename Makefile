# rbd-owner — see README.md. `make test` is the one command CI runs.
SHELL       := /bin/bash
GO          ?= go
BASE_VERSION := 0.1.0
# vX.Y.Z tags win; otherwise BASE_VERSION~git<commits>.<sha> (sorts before the release in dpkg and rpm)
VERSION     ?= $(shell v=$$(git describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null) && echo $${v\#v} || \
                 echo "$(BASE_VERSION)~git$$(git rev-list --count HEAD 2>/dev/null || echo 0).$$(git rev-parse --short=8 HEAD 2>/dev/null || echo unknown)")
# go-ceph's build tag follows the installed librados (pacific on Debian 12); evaluated lazily,
# after `deps` may have installed it
CEPH_TAG     = $(shell tests/ceph/build-tag)
LDFLAGS     := -s -w -X github.com/rbd-owner/rbd-owner/agent/version.Version=$(VERSION)
ARCH        := amd64

.PHONY: all build test unit model e2e lab lab-sh lab-down bench package package-check lint deps clean
all: build

deps:
	@tests/deps

build: deps
	@mkdir -p bin
	CGO_ENABLED=1 $(GO) build -tags "$(CEPH_TAG)" -trimpath -ldflags "$(LDFLAGS)" -o bin/rbd-owner ./agent/cmd/rbd-owner

# Everything: lint, the model checks, the Go tests with -race against a throwaway Ceph cluster,
# the package checks, and the two-node end-to-end tests on real kernels (needs root; ~4.5
# minutes with warm caches, plus ~1.5 for the model).
test: deps lint model unit package-check e2e
	@echo "make test: all passed"

unit: deps
	@tests/go-test

# The claim protocol's Promela models, checked exhaustively with spin (docs/safety.md): a table
# of states, memory and time; every check must end as expected (~1.5 minutes on 2 cores).
model: deps
	@model/check

# The two-node lab on real kernels (tests/lab; qemu TCG guests, Ceph on the host in a private
# network namespace; needs root). e2e: every scenario as PASS/FAIL assertions, ends with
# "N passed, M failed" (about 4-5 minutes on 2 cores, guest image cached).
e2e: package
	@tests/deps lab
	@tests/lab/e2e

# lab: the narrated demo; `make lab KEEP=1` leaves the lab running (then lab-sh, lab-down).
KEEP ?= 0
NODE ?= node-a
lab: package
	@tests/deps lab
	@KEEP=$(KEEP) tests/lab/lab demo

lab-sh:
	@tests/lab/lab sh $(NODE)

lab-down:
	@tests/lab/lab down

bench: deps
	@RACE= tests/go-test -run '^$$' -bench . -benchtime 300x ./agent/...

# CEPH_MIN: the Ceph release (major.minor) of the librados-dev the binary was built against; the
# packages depend on librados2/librbd1 at least that new (go-ceph is compiled for its API).
package: build
	@test -f udev/60-rbd-owner.rules || { echo "package: udev/60-rbd-owner.rules is missing" >&2; exit 1; }
	@mkdir -p dist
	@rm -f dist/rbd-owner_*.deb dist/rbd-owner-*.rpm
	@ceph_min=$$(dpkg-query -W -f='$${Version}' librados-dev 2>/dev/null | sed -n 's/^\([0-9]*:\)\{0,1\}\([0-9][0-9]*\.[0-9][0-9]*\).*/\2/p'); \
	  export VERSION="$(VERSION)" ARCH=$(ARCH) CEPH_MIN="$${ceph_min:-16.2}" && set -x && \
	  $(GO) tool nfpm package --config nfpm.yaml --packager deb --target "dist/rbd-owner_$(VERSION)_$(ARCH).deb" && \
	  $(GO) tool nfpm package --config nfpm.yaml --packager rpm --target "dist/rbd-owner-$(VERSION).x86_64.rpm"

# Checks the built packages: contents, conffile, units (systemd-analyze verify), and a real
# dpkg -i / purge on this machine, which it leaves as it found it. Needs root.
package-check: package
	@tests/package-check "dist/rbd-owner_$(VERSION)_$(ARCH).deb" "dist/rbd-owner-$(VERSION).x86_64.rpm"

# gofmt, go vet, and shellcheck over every shell script in tests/, packaging/, model/ and .ci/
lint: deps
	@out=$$(gofmt -l agent); [ -z "$$out" ] || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	$(GO) vet -tags "$(CEPH_TAG)" ./...
	@tests/lint-shell

clean:
	rm -rf bin dist
