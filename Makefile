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
# the packages' maintainer (RFC 822: a role address in the project's name, not a person's; the
# domain is a placeholder until the project has one, see packaging/lintian-overrides) and home
# the packaging revision (nfpm.yaml's release): 1 for this machine's build; each Debian release's
# .deb from `make debs` has its own, which sorts by release and before 1 (1~deb12, 1~deb13, 1~deb14)
PKG_RELEASE ?= 1
# the packages' file names
DEB         = rbd-owner_$(VERSION)-$(PKG_RELEASE)_$(ARCH).deb
RPM         = rbd-owner-$(VERSION)-$(PKG_RELEASE).x86_64.rpm
# the date of the manual pages and of the changelog's newest entry: the commit's, for
# reproducible packages (given from outside where there is no git, as in packaging/build-debs)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
MAINTAINER  := rbd-owner maintainers <maintainers@rbd-owner.invalid>
HOMEPAGE    := https://github.com/rbd-owner/rbd-owner
# the agent is a position-independent executable with the usual hardening of its C parts (cgo:
# go-ceph and agent/watchers), as Debian's and Fedora's build flags give packaged C programs:
# fortified functions, stack protector, full RELRO and immediate binding. The version of the
# librados-dev built against is a define too (unused by the code): Go's build cache hashes cgo's
# flags and compiler but not the system headers, and packaging/build-debs shares the cache with
# the Debian releases' roots, so no cgo object is ever taken from a build against other headers.
# (Evaluated lazily, after `deps` may have installed librados-dev.)
CEPH_DEV     = $(shell dpkg-query -W -f='$${Version}' librados-dev 2>/dev/null | tr -c 'A-Za-z0-9\n' _)
AGENT_BUILD := -buildmode=pie
AGENT_ENV    = CGO_CPPFLAGS="-D_FORTIFY_SOURCE=2 -DRBD_OWNER_LIBRADOS_DEV=$(CEPH_DEV)" \
               CGO_CFLAGS="-O2 -fstack-protector-strong -fstack-clash-protection -fcf-protection" \
               CGO_LDFLAGS="-Wl,-z,relro -Wl,-z,now"

.PHONY: all build test deps-lab unit model e2e e2e-trixie-reef e2e-prod matrix chaos bench-go lab lab-sh lab-down bench package debs cli-docs pkg-meta package-check lint metrics-check k8s-check k8s-e2e k8s-lab k8s-lab-down deps shape clean
all: build

deps:
	@tests/deps

build: deps
	@mkdir -p bin
	CGO_ENABLED=1 $(AGENT_ENV) $(GO) build $(AGENT_BUILD) -tags "$(CEPH_TAG)" -trimpath -ldflags "$(LDFLAGS)" -o bin/rbd-owner-agent ./agent/cmd/rbd-owner-agent
	objcopy --remove-section=.comment bin/rbd-owner-agent  # the C compiler's version strings, as dh_strip does
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/rbd-owner ./agent/cmd/rbd-owner
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/rbd-shim ./agent/cmd/rbd-shim

# Everything: lint, the protocol model's checks, the Go tests with -race against a throwaway
# Ceph cluster, the alert rules' promtool tests, the kustomize component's render check, the
# package checks (the oldest and the newest Debian release's own .deb included), and the two-node
# end-to-end tests on real kernels (needs root): the oldest supported releases in the small shape
# (make e2e: Debian 12 guests, Pacific) and the newest in the prod shape (make e2e-prod: forky
# guests, kernel 7.2, Tentacle with aes256k keys only), without the closing chaos round (make e2e
# alone, make matrix and make chaos run it), so that it stays within about 45 minutes. The other
# cells: make matrix. The labs' guest images and Ceph roots are built in the background beside the
# first parts (PREFETCH, tests/lab/prefetch). Ends with a table of each part's wall time
# (tests/make-test).
TEST_PARTS := deps-lab lint model unit metrics-check k8s-check package package-check e2e e2e-prod
TEST_DEBS  := bookworm forky
PREFETCH    = tests/lab/prefetch root:tentacle image:$(LAB_GUEST)+image:$(PROD_GUEST)
test:
	@MAKE="$(MAKE)" PREFETCH="$(PREFETCH)" DEB_RELEASES="$(TEST_DEBS)" E2E_CHAOS=0 tests/make-test $(TEST_PARTS)
	@echo "make test: all passed"

deps-lab:
	@tests/deps lab

unit: deps
	@tests/go-test

# The claim protocol's Promela models, checked exhaustively with spin (docs/safety.md): a table
# of states, memory and time; every check must end as expected (87 checks, one per core side by side:
# about 10 minutes on 2 cores).
model: deps
	@model/check

# The two-node lab on real kernels (tests/lab; qemu TCG guests, Ceph on the host in a private
# network namespace; needs root). e2e: every scenario as PASS/FAIL assertions, ends with
# "N passed, M failed" (about 17 minutes on 2 cores with the closing chaos round, guest image cached).
# The releases, for e2e, lab and chaos (defaults: the oldest supported, Debian 12 and Pacific):
#   LAB_GUEST=bookworm|trixie|forky  the guests: Debian 12 (kernel 6.1, Ceph 16.2 client libraries),
#                               Debian 13 (kernel 6.12, Ceph 18.2 Reef) or forky (kernel 7.2, Ceph
#                               20.2 Tentacle); all install the same .deb
#   LAB_CLUSTER=pacific|reef|tentacle  the cluster: the host's Ceph 16.2, or Debian 13's Ceph 18.2
#                               or forky's 20.2 run in a chroot inside the lab namespace (built
#                               once into the lab cache)
LAB_GUEST   ?= bookworm
LAB_CLUSTER ?= pacific
export LAB_GUEST LAB_CLUSTER
e2e: package
	@tests/deps lab
	@tests/lab/e2e

# One cell of the matrix: Debian 13 guests (kernel 6.12) with a Reef cluster.
e2e-trixie-reef: package
	@tests/deps lab
	@LAB_GUEST=trixie LAB_CLUSTER=reef tests/lab/e2e

# The e2e on the production-shaped cluster (three monitors, msgr2 only with ms_mode secure set in
# the monitors' config store as Rook sets it, pools of size 2 on two OSDs each: LAB_TOPOLOGY=prod,
# tests/lab/lib.sh), on the newest releases: forky guests (kernel 7.2, Tentacle's client
# libraries, forky's own .deb from make debs) and a Tentacle 20.2.4 cluster that allows only
# aes256k keys, where the e2e also rotates the agents' key under a writer; in `make test` (about
# 21 minutes). PROD_GUEST/PROD_CLUSTER choose others (bookworm/pacific: the oldest).
# make e2e ends with the chaos round; this one leaves it out unless PROD_CHAOS=1 (2 to 3 minutes).
PROD_GUEST   ?= forky
PROD_CLUSTER ?= tentacle
PROD_CHAOS   ?= 0
e2e-prod: package debs
	@tests/deps lab
	@LAB_TOPOLOGY=prod LAB_GUEST=$(PROD_GUEST) LAB_CLUSTER=$(PROD_CLUSTER) E2E_CHAOS=$(PROD_CHAOS) tests/lab/e2e

# The e2e over {bookworm, trixie guests} x {pacific, reef clusters}, one lab after the other
# (tests/lab/matrix): one table of passed, failed and wall time per combination (about 30 minutes
# with the images cached). CELLS="trixie/pacific bookworm/reef" runs only those.
CELLS ?=
matrix: package debs
	@tests/deps lab
	@tests/lab/matrix $(CELLS)

# The fault campaign on the lab's real kernels (tests/chaos/run): ROUNDS rounds of randomised
# faults from SEED (printed; the same SEED replays the same schedule) against two writers, each
# round checked from the data. `make e2e` ends with a short fixed-seed run in the same lab.
ROUNDS ?= 3
SEED ?=
chaos: package
	@tests/deps lab
	@tests/chaos/run $(ROUNDS) $(SEED)

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

# The Kubernetes lab (tests/k8s/lab, docs/kubernetes.md): the two-node lab's guests (Debian 13,
# 2 GiB each) made Kubernetes v1.35.4 nodes (containerd, kubelet, kube-proxy), the control plane
# on the host in the lab namespace, and ceph-csi's own RBD manifests patched by
# packaging/kubernetes applied with kubectl apply -k. ceph-csi comes from the caller:
# CEPHCSI_SRC (a source tree or git repository; CEPHCSI_REF, default v3.12.2) or CEPHCSI_BIN.
# Not in `make test`: the cold Kubernetes and ceph-csi builds alone take about half an hour.
#   k8s-e2e    the scenarios as PASS/FAIL assertions ("N passed, M failed"); KEEP=1 leaves it up
#   k8s-lab    up, ceph-csi applied, left running (tests/k8s/lab kubectl …, make k8s-lab-down)
# K8S_CSI=operator deploys ceph-csi through the ceph-csi-operator instead, built from CSIOP_SRC (a
# source tree or git repository; CSIOP_REF, default v1.0.4), its Driver patched by
# packaging/kubernetes/ceph-csi-operator; the same scenarios, plus the operator's own.
CEPHCSI_HOW := set CEPHCSI_SRC to a ceph-csi source tree or git repository (CEPHCSI_REF picks the tag, default v3.12.2), or CEPHCSI_BIN to a built cephcsi
k8s-e2e k8s-lab:
	@[ -n "$${CEPHCSI_SRC:-}$${CEPHCSI_BIN:-}" ] || { echo "make $@: no ceph-csi to run: $(CEPHCSI_HOW)" >&2; exit 2; }
	@[ "$${K8S_CSI:-manifests}" != operator ] || [ -n "$${CSIOP_SRC:-}" ] || { echo "make $@: K8S_CSI=operator: set CSIOP_SRC to a ceph-csi-operator source tree or git repository (CSIOP_REF picks the tag, default v1.0.4)" >&2; exit 2; }
	@$(MAKE) --no-print-directory package
	@tests/deps lab
	@tests/k8s/lab $(if $(filter k8s-lab,$@),up,e2e)

k8s-lab-down:
	@tests/k8s/lab down

# The benchmark table on the lab's real kernels, the agent on the fake kernel and the claim
# operations on a throwaway cluster (tests/bench/run; docs/benchmarks.md has a dated run).
# PARTS=fleet: only the fleet benchmark (tests/bench/fleet: N agents in one process against a
# throwaway cluster, the RADOS calls by kind against N, before and after a revision): no lab,
# no packages. bench-go: only the Go benchmarks (fake kernel, test cluster).
ifeq ($(strip $(PARTS)),fleet)
bench: deps
	@tests/bench/fleet
else
bench: package
	@tests/deps lab
	@tests/bench/run
endif

bench-go: deps
	@RACE= tests/go-test -run '^$$' -bench . -benchtime 300x ./agent/...

# The shipped Prometheus alert rules: promtool check rules, and promtool test rules over
# packaging/prometheus/tests/ (installs Debian's prometheus package for promtool when missing).
metrics-check:
	@tests/promtool-check

# The kustomize component for ceph-csi's RBD node plugin (packaging/kubernetes), rendered with
# `go tool kustomize` over ceph-csi v3.12.2's manifests (tests/kubernetes) and checked by the Go
# tests there; also the example overlay and the Rook and ceph-csi-operator snippets. A second or
# so once the tool is built (the first run compiles kustomize, ~15 s).
k8s-check:
	@GO="$(GO)" tests/kustomize-check

# CEPH_MIN: the Ceph release (major.minor) of the librados-dev the binary was built against; the
# packages depend on librados2/librbd1 at least that new (go-ceph is compiled for its API).
# Evaluated lazily, after `deps` may have installed librados-dev.
CEPH_MIN     = $(or $(shell dpkg-query -W -f='$${Version}' librados-dev 2>/dev/null | sed -n 's/^\([0-9]*:\)\{0,1\}\([0-9][0-9]*\.[0-9][0-9]*\).*/\2/p'),16.2)
# NFPM: the packager (the module's tool; packaging/build-debs gives the one built on the host to
# the releases' roots, which would otherwise each build it again)
NFPM        ?= $(GO) tool nfpm
# LIBC_MIN: the newest GLIBC symbol version the agent uses (what dpkg-shlibdeps would make of it):
# the .deb depends on libc6 at least that new. Evaluated lazily, after the build.
LIBC_MIN     = $(shell objdump -T bin/rbd-owner-agent 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
# The manual pages and the CLI's bash, zsh and fish completions, generated into dist/ for the
# packages: the completions by the built CLI itself; the pages by a build of it with -tags gendocs
# (bin/rbd-owner-gendocs, not shipped), dated by the commit for reproducible pages: rbd-owner(8)
# from the command definitions, rbd-owner.yaml(5) from the config's keys (agent/config/keys.go)
# and rbd-owner-agent(8) with the agent's flags (agent/internal/agentflags).
cli-docs: build
	@rm -rf dist/completions dist/man
	@mkdir -p dist/completions dist/man
	CGO_ENABLED=0 $(GO) build -tags gendocs -trimpath -ldflags "$(LDFLAGS)" -o bin/rbd-owner-gendocs ./agent/cmd/rbd-owner
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) bin/rbd-owner-gendocs __gendocs dist/man
	gzip -9n dist/man/rbd-owner.8 dist/man/rbd-owner-agent.8 dist/man/rbd-owner.yaml.5
	bin/rbd-owner completion bash >dist/completions/rbd-owner
	bin/rbd-owner completion zsh >dist/completions/_rbd-owner
	bin/rbd-owner completion fish >dist/completions/rbd-owner.fish

# The packages' changelog (from CHANGELOG.md, its [Unreleased] section as this VERSION, dated by
# the commit) and their DEP-5 copyright (from the Go modules compiled into the three programs
# and their licence files; it fails when nfpm.yaml's license no longer says what they contain).
pkg-meta: build
	@mkdir -p dist
	$(GO) run ./agent/internal/pkgmeta/gen changelog -version "$(VERSION)" -revision "$(PKG_RELEASE)" -maintainer "$(MAINTAINER)" \
	  -date "$(SOURCE_DATE_EPOCH)" -out dist/changelog.yml
	$(GO) run ./agent/internal/pkgmeta/gen copyright -contact "$(MAINTAINER)" -source "$(HOMEPAGE)" \
	  -tags "$(CEPH_TAG)" -out dist/copyright \
	  -program /usr/lib/rbd-owner/rbd-owner-agent=./agent/cmd/rbd-owner-agent \
	  -program /usr/bin/rbd-owner=./agent/cmd/rbd-owner \
	  -program /usr/lib/rbd-owner/bin/rbd=./agent/cmd/rbd-shim

package: build cli-docs pkg-meta
	@test -f udev/60-rbd-owner.rules || { echo "package: udev/60-rbd-owner.rules is missing" >&2; exit 1; }
	@mkdir -p dist
	@rm -f dist/rbd-owner_*.deb dist/rbd-owner-*.rpm
	@# lintian raises initial-upload-closes-no-bugs for a plain -1 revision only: its override ships there only
	@cat packaging/lintian-overrides $(if $(filter 1,$(PKG_RELEASE)),packaging/lintian-overrides.revision-1) >dist/lintian-overrides
	@export VERSION="$(VERSION)" PKG_RELEASE="$(PKG_RELEASE)" ARCH=$(ARCH) CEPH_MIN="$(CEPH_MIN)" LIBC_MIN="$(LIBC_MIN)" MAINTAINER="$(MAINTAINER)" HOMEPAGE="$(HOMEPAGE)" && set -x && \
	  $(NFPM) package --config nfpm.yaml --packager deb --target "dist/$(DEB)" && \
	  $(NFPM) package --config nfpm.yaml --packager rpm --target "dist/$(RPM)"

# One .deb per Debian release, each built against that release's own Ceph libraries, into
# dist/debian/ (packaging/build-debs): Debian 12's (Pacific) on this machine, Debian 13's (Reef)
# and forky's (Tentacle) in their releases' roots (tests/ceph/build-root, cached in the lab
# cache) with the host's Go toolchain. Each depends on its release's librados2/librbd1 and is
# VERSION-1~deb12, -1~deb13 or -1~deb14. The lab's guests install their release's (tests/lab).
DEB_RELEASES ?= bookworm trixie forky
debs: package
	@tests/deps lab
	@VERSION="$(VERSION)" SOURCE_DATE_EPOCH="$(SOURCE_DATE_EPOCH)" GO="$(GO)" packaging/build-debs $(DEB_RELEASES)

# Checks the built packages: contents, conffile, units (systemd-analyze verify), and a real
# dpkg -i / purge on this machine, which it leaves as it found it; the .rpm's contents,
# dependencies (resolved against stand-ins for the distributions' Ceph libraries) and scriptlets,
# installed, upgraded and erased in scratch roots (rpm --root); then each Debian release's .deb
# (make debs): lintian, its revision, its agent's go-ceph tag and links, the agent started in its
# release's root, and Depends that its release satisfies and an older one does not
# (tests/package-check-debs). Needs root.
package-check: package debs
	@CEPH_MIN="$(CEPH_MIN)" LIBC_MIN="$(LIBC_MIN)" GO="$(GO)" MAINTAINER="$(MAINTAINER)" HOMEPAGE="$(HOMEPAGE)" tests/package-check "dist/$(DEB)" "dist/$(RPM)"
	@GO="$(GO)" tests/package-check-debs

# gofmt, go vet, golangci-lint (.golangci.yml; pinned in its own module, tools/lint/go.mod, so
# that its dependencies stay out of the agent's; the first run builds it, a few minutes on 2
# cores; with the build tag lab, so that the lab's scenarios are checked too), and shellcheck over every shell script in tests/, packaging/, model/ and .ci/
lint: deps
	@out=$$(gofmt -l agent tests); [ -z "$$out" ] || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	$(GO) vet -tags "$(CEPH_TAG) lab" ./...
	$(GO) tool -modfile=tools/lint/go.mod golangci-lint run --build-tags "$(CEPH_TAG),lab" ./...
	@tests/import-graph -q
	@tests/lint-shell

# Structure figures of the claim and daemon packages from their source (agent/internal/shape,
# issue 52): per type its methods, lines, mutex and map fields; the links between each package's
# files, those that run upward (within a cycle) and the files in cycles; the longest function.
shape:
	@$(GO) run ./agent/internal/shape ./agent/claim ./agent/daemon

clean:
	rm -rf bin dist
