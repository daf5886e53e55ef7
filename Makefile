# cogpu build. `make` builds into build/; `make SAN=asan` and `make SAN=tsan`
# build sanitizer variants into build-asan/ and build-tsan/, `make DEBUG=1`
# a debug variant (internal checks on) into build-debug/. `make check`
# runs the test suite of one build; `make check-all` runs it in the plain,
# ASan+UBSan and TSan builds (the README's test command). `make install`
# honours PREFIX and DESTDIR.

PREFIX ?= /usr/local
DESTDIR ?=
LIBDIR ?= $(PREFIX)/lib
BINDIR ?= $(PREFIX)/bin
INCDIR ?= $(PREFIX)/include
DATADIR ?= $(PREFIX)/share
PCDIR ?= $(LIBDIR)/pkgconfig
# cogpu's private libraries (the preload library, the SPANK plug-in).
# `cogpu run` looks for the preload library at ../lib/cogpu from its own
# binary, so this stays $(PREFIX)/lib/cogpu where LIBDIR is lib64 (RPM).
PKGLIBDIR ?= $(LIBDIR)/cogpu
SBINDIR ?= $(PREFIX)/sbin
DOCDIR ?= $(DATADIR)/doc/cogpu
MANDIR ?= $(DATADIR)/man
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
# systemd reads units and tmpfiles.d snippets under /usr/local/lib too.
UNITDIR ?= $(PREFIX)/lib/systemd/system
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d

CC ?= cc
SAN ?=
# COGPU_DEBUG turns on the internal checks (src/common/internal.h): the
# ledger's invariants after every commit. The sanitizer builds have it;
# `make DEBUG=1` builds a plain debug variant into build-debug/.
ifeq ($(SAN),)
ifeq ($(DEBUG),1)
B ?= build-debug
SANFLAGS := -DCOGPU_DEBUG
else
B ?= build
SANFLAGS :=
endif
else ifeq ($(SAN),asan)
B ?= build-asan
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
            -DCOGPU_DEBUG
else ifeq ($(SAN),tsan)
B ?= build-tsan
SANFLAGS := -fsanitize=thread -fno-omit-frame-pointer -DCOGPU_DEBUG
else
$(error SAN must be empty, asan or tsan)
endif

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
        -Wmissing-prototypes -Wmissing-declarations -Wformat=2
BASEFLAGS := -std=gnu11 -O2 -g -fPIC -fvisibility=hidden $(WARN) \
             -Iinclude -Isrc/common -Isrc -D_GNU_SOURCE
ALLCFLAGS := $(BASEFLAGS) $(SANFLAGS) $(CFLAGS)
LDLIBS := -ldl -lpthread
# The version is include/cogpu.h's (the one place it is written); the
# library's file name and cogpu.pc take it from there.
VERSION := $(shell sed -n 's/^\#define COGPU_VERSION_STRING "\(.*\)"$$/\1/p' include/cogpu.h)
ifeq ($(VERSION),)
$(error cannot read COGPU_VERSION_STRING from include/cogpu.h)
endif
# The commit `cogpu --version` and `cogpud --version` name: in a git
# checkout, HEAD's abbreviated hash, with -dirty when tracked files differ
# from it (only this checkout's own .git is asked, never that of a folder
# it was unpacked in). A build outside git (a release tarball, a package built from
# one) sets it on make's command line, `make COGPU_COMMIT=abc1234`;
# otherwise it is "unknown".
COGPU_COMMIT ?=

LIB_SRCS := $(sort $(wildcard src/common/*.c src/nvml/*.c src/node/*.c src/ledger/*.c \
                                src/api/*.c))
# The job history (SQLite): the daemon and the CLI only, never libcogpu or
# the preload library, which load into users' programs.
HIST_SRCS := $(sort $(wildcard src/history/*.c))
HIST_OBJS := $(HIST_SRCS:%.c=$(B)/obj/%.o)
HIST_LIBS := -lsqlite3
DAEMON_SRCS := $(sort $(wildcard src/daemon/*.c tools/cogpud/*.c))
DAEMON_OBJS := $(DAEMON_SRCS:%.c=$(B)/obj/%.o)
CLI_SRCS := $(sort $(wildcard tools/cogpu/*.c))
# The cluster simulator (src/sim): common and the ledger's decision core
# only; linked into the CLI, the tests and bench-sim, never into libcogpu.
SIM_SRCS := $(sort $(wildcard src/sim/*.c))
SIM_OBJS := $(SIM_SRCS:%.c=$(B)/obj/%.o)
TEST_SRCS := $(sort $(wildcard tests/harness/*.c tests/unit/*.c tests/preload/test-*.c \
               tests/multiproc/*.c tests/fault/*.c tests/cli/*.c tests/experiment/test-*.c \
               tests/slurm/test-*.c tests/node/*.c tests/fuzz/fuzz-harness.c \
               tests/sim/test-*.c))
BENCH_SRCS := $(sort $(wildcard bench/bench-*.c))
FAKE_NVML_SRCS := $(sort $(wildcard tests/fakes/nvml/*.c))

PRELOAD_SRCS := $(sort $(wildcard src/preload/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(B)/obj/%.o)
# The preload library gets its own copy of the core, built with
# COGPU_SMALL_TLS: its thread-local storage is carried by every thread of
# every program under cogpu run, so it is kept to a few dozen bytes, in
# the default (general-dynamic) model, so that the library can also be
# dlopened after start-up.
PRELOAD_OBJS := $(PRELOAD_SRCS:%.c=$(B)/objp/%.o) $(LIB_SRCS:%.c=$(B)/objp/%.o)
CLI_OBJS := $(CLI_SRCS:%.c=$(B)/obj/%.o)
# The preload library's allocation table is also linked into the tests, so
# that its unit test races threads on it directly, and so is its lookup of
# glibc's own dl functions.
TEST_OBJS := $(TEST_SRCS:%.c=$(B)/obj/%.o) $(B)/obj/src/preload/table.o \
             $(B)/obj/src/preload/glibc-sym.o
# The daemon's message handling is tested as a function (the bounded
# random-message test of tests/node): its objects, not tools/cogpud's main.
TEST_OBJS += $(B)/obj/src/daemon/conn.o $(B)/obj/src/daemon/state.o \
             $(B)/obj/src/daemon/handle.o $(B)/obj/src/daemon/daemon.o \
             $(B)/obj/src/daemon/suspend.o $(B)/obj/src/daemon/record.o \
             $(HIST_OBJS) $(SIM_OBJS)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(B)/bench/%)

# The Slurm SPANK plug-in is built when Slurm's headers are installed
# (libslurm-dev). It is uninstrumented in every build, since Slurm's
# daemons and commands load it.
SLURM_H ?= $(wildcard /usr/include/slurm/spank.h)
SPANK_OBJS := $(B)/objs/contrib/slurm/spank-cogpu.o $(LIB_SRCS:%.c=$(B)/objs/%.o)
SPANK := $(if $(SLURM_H),$(B)/spank_cogpu.so)

.PHONY: all lib cli daemon man tests check check-node check-all bench install uninstall clean \
        format format-check

all: lib cli daemon preload man tests $(SPANK)

lib: $(B)/libcogpu.a $(B)/libcogpu.so $(B)/libcogpu.so.0
preload: $(B)/libcogpu-preload.so
cli: $(B)/cogpu
daemon: $(B)/cogpud
# The CLI tests run the built cogpu.
tests: $(B)/tests/run-tests $(B)/tests/fakes/libnvidia-ml.so.1 $(B)/cogpu $(B)/cogpud \
       $(B)/tests/fakes/libcuda.so.1

# The commit, in a header only the two main.c files include. It is written
# again only when the commit changes, so a new commit rebuilds those two
# files and relinks, nothing else. Its temporary file is this shell's own:
# check-all runs two makes in one build folder at once, and a shared name
# made one's mv fail (the node pass, 0 s).
.PHONY: FORCE
FORCE:
$(B)/gen/version.h: FORCE
	@mkdir -p $(dir $@)
	@c='$(COGPU_COMMIT)'; \
	if [ -z "$$c" ] && [ -e .git ]; then \
	  c=$$(git describe --always --dirty --abbrev=12 --exclude='*' 2>/dev/null) || c=; \
	fi; \
	t=$@.tmp.$$$$; \
	printf '#define COGPU_COMMIT "%s"\n' "$${c:-unknown}" > $$t; \
	if cmp -s $$t $@; then rm -f $$t; else mv -f $$t $@; fi
$(B)/obj/tools/cogpu/main.o $(B)/obj/tools/cogpud/main.o: $(B)/gen/version.h
$(B)/obj/tools/cogpu/main.o $(B)/obj/tools/cogpud/main.o: ALLCFLAGS += -I$(B)/gen

# The manual pages, with this build's version and install paths. cogpu.conf(5)
# gets its OPTIONS section from options.def, through man/gen-conf.c (a
# build tool, never installed), so a new option is in it without an edit.
MAN_PAGES := $(B)/man/cogpu.1 $(B)/man/cogpud.8 $(B)/man/spank_cogpu.8 $(B)/man/cogpu.conf.5
man: $(MAN_PAGES) $(B)/cogpu.conf.example
$(B)/cogpu.conf.example: $(B)/man/gen-conf
	$(B)/man/gen-conf --example > $@.tmp.$$$$ && mv -f $@.tmp.$$$$ $@
MAN_SED := sed -e 's|@VERSION@|$(VERSION)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
               -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@DATADIR@|$(DATADIR)|g' \
               -e 's|@PKGLIBDIR@|$(PKGLIBDIR)|g' \
               -e 's|@UNITDIR@|$(UNITDIR)|g'
# The paths in the pages are install's: rewritten whenever they change.
# Temporary files are named by the shell's PID, as for version.h above: a
# shared name made the plain pass fail in CI (mv: cannot stat paths.tmp).
$(B)/man/paths: FORCE
	@mkdir -p $(dir $@)
	@t=$@.tmp.$$$$; \
	printf '%s\n' '$(VERSION)' '$(DOCDIR)' '$(LIBDIR)' '$(DATADIR)' '$(UNITDIR)' '$(PKGLIBDIR)' > $$t; \
	if cmp -s $$t $@; then rm -f $$t; else mv -f $$t $@; fi
$(B)/man/%: man/%.in $(B)/man/paths include/cogpu.h
	@echo "MAN $@"
	@$(MAN_SED) $< > $@
$(B)/man/gen-conf: man/gen-conf.c src/common/options.def
	$(CC) $(BASEFLAGS) $(CFLAGS) -o $@ $<
$(B)/man/cogpu.conf.5: man/cogpu.conf.5.in $(B)/man/gen-conf $(B)/man/paths include/cogpu.h
	@echo "MAN $@ (options.def)"
	@$(B)/man/gen-conf $< | $(MAN_SED) > $@.tmp.$$$$ && mv -f $@.tmp.$$$$ $@

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "CC $<"
	@$(CC) $(ALLCFLAGS) -MMD -MP -c $< -o $@

# In a sanitizer build it is instrumented too: the tests preload the
# sanitizer runtime ahead of it into every process they start (the runtime
# must be a process's first library), so its code is checked wherever the
# tests run it. The default build's library loads into any program.
$(B)/objp/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "CC $< (preload)"
	@$(CC) $(ALLCFLAGS) -DCOGPU_SMALL_TLS -MMD -MP -c $< -o $@

# Only the driver's entry points and dlsym leave the preload library. Its
# references to its own hooks bind to its own definitions
# (-Bsymbolic-functions), never to an earlier interposer's of the same name.
$(B)/libcogpu-preload.so: $(PRELOAD_OBJS) src/preload/preload.map
	$(CC) $(ALLCFLAGS) -shared -Wl,-Bsymbolic-functions -Wl,-z,nodelete \
	    -Wl,--version-script=src/preload/preload.map \
	    -o $@ $(PRELOAD_OBJS) $(LDLIBS)

$(B)/objs/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "CC $< (plug-in)"
	@$(CC) $(BASEFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

# Slurm finds the plug-in's symbols by name; spank.map keeps the rest in.
$(B)/objs/contrib/slurm/spank-cogpu.o: BASEFLAGS += -fvisibility=default
$(B)/spank_cogpu.so: $(SPANK_OBJS) contrib/slurm/spank.map
	$(CC) $(BASEFLAGS) $(CFLAGS) -shared \
	    -Wl,--version-script=contrib/slurm/spank.map \
	    -o $@ $(SPANK_OBJS) $(LDLIBS)

$(B)/libcogpu.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/libcogpu.so: $(LIB_OBJS)
	$(CC) $(ALLCFLAGS) -shared -Wl,-soname,libcogpu.so.0 -o $@ $^ $(LDLIBS)

# A program linked with -L$(B) -lcogpu asks the loader for the soname: the
# build tree has it too, as install does.
$(B)/libcogpu.so.0: $(B)/libcogpu.so
	ln -sf libcogpu.so $@

$(B)/cogpu: $(CLI_OBJS) $(HIST_OBJS) $(SIM_OBJS) $(B)/libcogpu.a
	$(CC) $(ALLCFLAGS) -o $@ $(CLI_OBJS) $(HIST_OBJS) $(SIM_OBJS) $(B)/libcogpu.a $(HIST_LIBS) -lm $(LDLIBS)

# cogpud: the node daemon. libsystemd for socket activation, readiness and
# the watchdog (Debian libsystemd-dev).
$(B)/cogpud: $(DAEMON_OBJS) $(HIST_OBJS) $(B)/libcogpu.a
	$(CC) $(ALLCFLAGS) -o $@ $(DAEMON_OBJS) $(HIST_OBJS) $(B)/libcogpu.a -lsystemd $(HIST_LIBS) $(LDLIBS)

# Test doubles are built without sanitizers: they stand in for vendor
# libraries, which are not instrumented either. They depend on their headers
# too: both read the fake CUDA's shared state file, whose layout is
# versioned, and a stale build of one ignores the other's file.
$(B)/tests/fakes/libnvidia-ml.so.1: $(FAKE_NVML_SRCS) tests/fakes/cuda/fake-cuda-state.h
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) -shared -Wl,-soname,libnvidia-ml.so.1 -o $@ \
	    $(filter %.c,$^) $(LDLIBS)

$(B)/tests/fakes/libcuda.so.1: $(sort $(wildcard tests/fakes/cuda/*.c tests/fakes/cuda/*.h)) \
    src/cuda/cuda-abi.h
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) -shared -Wl,-soname,libcuda.so.1 -o $@ $(filter %.c,$^) $(LDLIBS)

# A minimal third-party CUDA interposer (profilers, other sharers), loaded
# before or after the preload library in the tests.
$(B)/tests/fakes/libinterposer.so: $(sort $(wildcard tests/fakes/interposer/*.c))
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) -shared -o $@ $^ $(LDLIBS)

$(B)/tests/run-tests: $(TEST_OBJS) $(B)/libcogpu.a
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Itests/harness -o $@ $(TEST_OBJS) $(B)/libcogpu.a -lsystemd $(HIST_LIBS) -lm $(LDLIBS)

$(TEST_OBJS): ALLCFLAGS += -Itests/harness -Itests/fuzz

# A CUDA driver program for the preload tests; its direct route links
# against the test double.
$(B)/tests/cudaprog: tests/preload/cudaprog.c $(B)/tests/fakes/libcuda.so.1
	$(CC) $(ALLCFLAGS) -Wno-missing-prototypes -o $@ $< \
	    -L$(B)/tests/fakes -l:libcuda.so.1 $(LDLIBS)

tests: $(B)/tests/cudaprog $(B)/libcogpu-preload.so \
       $(B)/tests/fakes/libinterposer.so

$(B)/bench/%: bench/%.c bench/bench.h $(B)/libcogpu.a
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Ibench -o $@ $< $(B)/libcogpu.a $(LDLIBS)

# The simulator's benchmark links the simulator.
$(B)/bench/bench-sim: bench/bench-sim.c bench/bench.h $(SIM_OBJS) $(B)/libcogpu.a
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Ibench -o $@ $< $(SIM_OBJS) $(B)/libcogpu.a -lm $(LDLIBS)

# The allocation table's benchmark drives the preload library's table.
$(B)/bench/bench-pl-table: bench/bench-pl-table.c bench/bench.h \
    $(B)/obj/src/preload/table.o $(B)/libcogpu.a
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Ibench -o $@ $< $(B)/obj/src/preload/table.o \
	    $(B)/libcogpu.a $(LDLIBS)

# The scrape benchmark renders with the command's metrics.c, and times the
# ledger lock by wrapping its lock calls at link time.
$(B)/bench/bench-scrape: bench/bench-scrape.c bench/bench.h \
    $(B)/obj/tools/cogpu/metrics.o $(B)/libcogpu.a
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Ibench -Itools/cogpu -o $@ $< $(B)/obj/tools/cogpu/metrics.o \
	    -Wl,--wrap=cogpu__ledger_lock -Wl,--wrap=cogpu__ledger_lock_bounded \
	    -Wl,--wrap=cogpu__ledger_unlock $(B)/libcogpu.a $(LDLIBS)

# The history benchmark drives src/history directly, and reads the
# daemon's database with SQLite.
$(B)/bench/bench-history: bench/bench-history.c bench/bench.h $(HIST_OBJS) $(B)/libcogpu.a
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Ibench -o $@ $< $(HIST_OBJS) $(B)/libcogpu.a $(HIST_LIBS) $(LDLIBS)

# bench-peak's baseline: the preload library without peak tracking (its
# usage page update compiled out, -DCOGPU_BENCH_NO_USAGE), for the
# benchmark only: tracking has no run-time switch. Never installed.
PRELOAD_NOUSAGE_OBJS := $(filter-out $(B)/objp/src/preload/account.o,$(PRELOAD_OBJS)) \
                        $(B)/objpn/src/preload/account.o
$(B)/objpn/src/preload/account.o: src/preload/account.c
	@mkdir -p $(dir $@)
	@echo "CC $< (preload, no usage)"
	@$(CC) $(ALLCFLAGS) -DCOGPU_SMALL_TLS -DCOGPU_BENCH_NO_USAGE -MMD -MP -c $< -o $@
$(B)/bench/libcogpu-preload-nousage.so: $(PRELOAD_NOUSAGE_OBJS) src/preload/preload.map
	$(CC) $(ALLCFLAGS) -shared -Wl,-Bsymbolic-functions -Wl,-z,nodelete \
	    -Wl,--version-script=src/preload/preload.map \
	    -o $@ $(PRELOAD_NOUSAGE_OBJS) $(LDLIBS)

# Fuzzing cogpud's message handler with afl++ (Debian afl++; optional).
# `make fuzz` builds the driver twice: instrumented by afl-cc for afl-fuzz
# (persistent mode), and plain, which writes the seed corpus and replays
# inputs (`build/fuzz/fuzz-daemon-plain FILE`). Then it fuzzes for
# FUZZ_SECONDS and lists what afl-fuzz found under build/fuzz/out.
AFL_CC ?= afl-clang-fast
FUZZ_SECONDS ?= 60
FUZZ_SRCS := $(LIB_SRCS) src/daemon/conn.c src/daemon/state.c src/daemon/handle.c \
             src/daemon/daemon.c src/daemon/suspend.c src/daemon/record.c $(HIST_SRCS) \
             tests/fuzz/fuzz-harness.c tests/fuzz/fuzz-daemon.c
FUZZ_ENV := LD_LIBRARY_PATH=$(abspath $(B))/tests/fakes FAKE_NVML_GPUS=16G,16G
.PHONY: fuzz fuzz-driver
fuzz-driver: $(B)/fuzz/fuzz-daemon-plain
$(B)/fuzz/fuzz-daemon-plain: $(FUZZ_SRCS) $(wildcard src/*/*.h src/*/*.def tests/fuzz/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Itests/fuzz -o $@ $(FUZZ_SRCS) -lsystemd $(HIST_LIBS) $(LDLIBS)
$(B)/fuzz/fuzz-daemon: $(FUZZ_SRCS) $(wildcard src/*/*.h src/*/*.def tests/fuzz/*.h)
	@mkdir -p $(dir $@)
	AFL_QUIET=1 $(AFL_CC) $(BASEFLAGS) $(CFLAGS) -Itests/fuzz -o $@ $(FUZZ_SRCS) \
	    -lsystemd $(HIST_LIBS) $(LDLIBS)
fuzz: $(B)/fuzz/fuzz-daemon $(B)/fuzz/fuzz-daemon-plain $(B)/tests/fakes/libnvidia-ml.so.1
	rm -rf $(B)/fuzz/seeds && $(FUZZ_ENV) $(B)/fuzz/fuzz-daemon-plain --seeds $(B)/fuzz/seeds
	for f in $(B)/fuzz/seeds/*; do $(FUZZ_ENV) $(B)/fuzz/fuzz-daemon-plain $$f || exit 1; done
	$(FUZZ_ENV) AFL_SKIP_CPUFREQ=1 AFL_NO_UI=1 AFL_NO_AFFINITY=1 \
	    AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_TMPDIR=$(abspath $(B))/fuzz \
	    afl-fuzz -V $(FUZZ_SECONDS) -i $(B)/fuzz/seeds -o $(B)/fuzz/out \
	    -- $(B)/fuzz/fuzz-daemon
	@echo "crashes: $$(ls $(B)/fuzz/out/default/crashes 2>/dev/null | grep -c id: || true)," \
	      "hangs: $$(ls $(B)/fuzz/out/default/hangs 2>/dev/null | grep -c id: || true)" \
	      "(replay one: $(FUZZ_ENV) $(B)/fuzz/fuzz-daemon-plain FILE)"

# Made at install time: it records PREFIX, which may differ between runs.
.PHONY: $(B)/cogpu.pc
$(B)/cogpu.pc: cogpu.pc.in
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	    -e 's|@INCDIR@|$(INCDIR)|' -e 's|@VERSION@|$(VERSION)|' $< > $@

# TSan needs ASLR-compatible mappings on recent kernels; setarch -R turns
# randomisation off for the test process when that is allowed.
TEST_WRAP := $(if $(filter tsan,$(SAN)),$(shell setarch -R true 2>/dev/null && echo setarch -R),)
TEST_MULT := $(if $(SAN),4,1)

SAN_ENV := TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
           UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

# J=N runs N tests at once (run-tests -j; default: twice the CPUs, at
# most 8).
TEST_J := $(if $(J),-j$(J))

check: all
	$(SAN_ENV) COGPU_TEST_TIMEOUT_MULTIPLIER=$(TEST_MULT) $(TEST_WRAP) $(B)/tests/run-tests $(TEST_J) $(T)

# The plain and ASan builds run the suite twice: daemonless (single-user
# mode) and in node mode, each test against a private cogpud (tests of the
# daemonless state file only run in the first pass). TSan runs it
# daemonless, and in node mode only the tests where threads of one process
# share a connection to the daemon. The tests that start a daemon of their
# own (tests/node: suspension, where the daemon's suspender thread works
# beside its loop; the daemon's; security) run once per build, in the
# daemonless pass (TEST_FILE_ONCE).
TSAN_NODE_TESTS := threads another_thread concurrent_members
check-node: all
	COGPU_TEST_NODE=1 $(SAN_ENV) COGPU_TEST_TIMEOUT_MULTIPLIER=$(TEST_MULT) \
	    $(TEST_WRAP) $(B)/tests/run-tests $(TEST_J) $(T)

# Every build and pass; the Slurm tests' pass beside the others
# (scripts/check-all.sh).
.PHONY: check-all print-tsan-node-tests
check-all:
	scripts/check-all.sh

print-tsan-node-tests:
	@echo $(TSAN_NODE_TESTS)

# The benchmarks, built only (CI: nothing else builds them, and an API
# change must not leave them broken).
.PHONY: bench-build
bench-build: $(BENCH_BINS) $(B)/bench/libcogpu-preload-nousage.so

# Every benchmark end to end, with a hundredth of its counts (CI: they
# must still run, not only build); the figures mean nothing.
.PHONY: bench-smoke
bench-smoke: lib cli preload daemon $(BENCH_BINS) $(B)/tests/fakes/libnvidia-ml.so.1 \
       $(B)/tests/fakes/libcuda.so.1 $(B)/tests/cudaprog \
       $(B)/bench/libcogpu-preload-nousage.so
	BENCH_SMOKE=1 B=$(B) bench/run.sh >/dev/null

bench: lib cli preload daemon $(BENCH_BINS) $(B)/tests/fakes/libnvidia-ml.so.1 \
       $(B)/tests/fakes/libcuda.so.1 $(B)/tests/cudaprog \
       $(B)/bench/libcogpu-preload-nousage.so
	B=$(B) bench/run.sh

# FGD's Fig. 9a with the simulator, 10 seeds, against the published
# figures (docs/simulation.md); needs ../shared/traces or COGPU_TRACES.
.PHONY: sim-fgd
sim-fgd: $(B)/cogpu
	B=$(B) scripts/sim-fgd.sh

# The simulator against a real replay of 300 jobs on the private Slurm
# cluster (docs/simulation.md); the suite runs 100. Root, Slurm, traces.
.PHONY: sim-validate
sim-validate: tests
	COGPU_TEST_REPLAY_JOBS=300 COGPU_TEST_REPLAY_SKIP=100 COGPU_TEST_REPLAY_SPAN=400 \
	  $(B)/tests/run-tests slurm_replay_trace

# The RPM packages (contrib/rpm/cogpu.spec), built with rpmbuild from the
# tracked files and their file lists checked (README.md, "RPM packages"). Needs
# the rpm package (the set-up installs it); about ten seconds. CI runs it.
.PHONY: rpm
rpm:
	./scripts/rpm-test.sh

# The workload-mix experiment on a GPU node (docs/experiment.md).
.PHONY: experiment
experiment: all
	$(MAKE) -C bench/experiment workloads B=$(abspath $(B))
	B=$(B) bench/experiment/run.sh --mix small

install: lib cli daemon preload man $(SPANK) $(B)/cogpu.pc
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) $(DESTDIR)$(PCDIR)
	install -d $(DESTDIR)$(PKGLIBDIR)
	install -m 0755 $(B)/cogpu $(DESTDIR)$(BINDIR)/cogpu
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(TMPFILESDIR) \
	    $(DESTDIR)$(DOCDIR)
	install -m 0755 $(B)/cogpud $(DESTDIR)$(SBINDIR)/cogpud
	for u in cogpud.socket cogpud.service cogpu-exporter.service; do \
	  sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|@BINDIR@|$(BINDIR)|g' \
	      -e 's|@DOCDIR@|$(DOCDIR)|g' \
	      contrib/systemd/$$u > $(DESTDIR)$(UNITDIR)/$$u || exit 1; \
	  chmod 0644 $(DESTDIR)$(UNITDIR)/$$u; \
	done
	install -m 0644 contrib/systemd/cogpu-tmpfiles.conf \
	    $(DESTDIR)$(TMPFILESDIR)/cogpu.conf
	install -m 0644 docs/security.md docs/architecture.md docs/options.md docs/metrics.md \
	    docs/slurm.md docs/history.md docs/suspension.md docs/simulation.md CHANGELOG.md \
	    $(DESTDIR)$(DOCDIR)/
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8 \
	    $(DESTDIR)$(BASHCOMPDIR)
	install -m 0644 $(B)/man/cogpu.1 $(DESTDIR)$(MANDIR)/man1/cogpu.1
	install -m 0644 $(B)/man/cogpu.conf.5 $(DESTDIR)$(MANDIR)/man5/cogpu.conf.5
	install -m 0644 $(B)/man/cogpud.8 $(B)/man/spank_cogpu.8 $(DESTDIR)$(MANDIR)/man8/
	install -m 0644 contrib/bash-completion/cogpu $(DESTDIR)$(BASHCOMPDIR)/cogpu
	install -d $(DESTDIR)$(DATADIR)/cogpu
	install -m 0644 $(B)/cogpu.conf.example $(DESTDIR)$(DATADIR)/cogpu/cogpu.conf.example
	install -m 0755 $(B)/libcogpu-preload.so $(DESTDIR)$(PKGLIBDIR)/libcogpu-preload.so
	install -m 0644 $(B)/libcogpu.a $(DESTDIR)$(LIBDIR)/libcogpu.a
	install -m 0755 $(B)/libcogpu.so $(DESTDIR)$(LIBDIR)/libcogpu.so.$(VERSION)
	ln -sf libcogpu.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libcogpu.so.0
	ln -sf libcogpu.so.0 $(DESTDIR)$(LIBDIR)/libcogpu.so
	install -m 0644 include/cogpu.h include/schedgpu.h $(DESTDIR)$(INCDIR)/
	install -m 0644 $(B)/cogpu.pc $(DESTDIR)$(PCDIR)/cogpu.pc
	install -d $(DESTDIR)$(DATADIR)/cogpu/slurm
	install -m 0644 contrib/slurm/cli_filter.lua contrib/slurm/job_submit.lua \
	    contrib/slurm/slurm.conf \
	    $(DESTDIR)$(DATADIR)/cogpu/slurm/
	sed 's|/usr/local/lib/cogpu|$(PKGLIBDIR)|' contrib/slurm/plugstack.conf \
	    > $(DESTDIR)$(DATADIR)/cogpu/slurm/plugstack.conf
	$(if $(SPANK),install -m 0755 $(SPANK) $(DESTDIR)$(PKGLIBDIR)/spank_cogpu.so)
	install -d $(DESTDIR)$(DATADIR)/cogpu/prometheus
	install -m 0644 contrib/prometheus/cogpu.rules.yml contrib/prometheus/cogpu.rules.test.yml \
	    contrib/prometheus/grafana-dashboard.json $(DESTDIR)$(DATADIR)/cogpu/prometheus/

uninstall:
	rm -rf $(DESTDIR)$(PKGLIBDIR)
	rm -f $(DESTDIR)$(SBINDIR)/cogpud $(DESTDIR)$(UNITDIR)/cogpud.socket \
	      $(DESTDIR)$(UNITDIR)/cogpud.service $(DESTDIR)$(UNITDIR)/cogpu-exporter.service \
	      $(DESTDIR)$(TMPFILESDIR)/cogpu.conf
	rm -rf $(DESTDIR)$(DOCDIR)
	rm -f $(DESTDIR)$(MANDIR)/man1/cogpu.1 $(DESTDIR)$(MANDIR)/man5/cogpu.conf.5 \
	      $(DESTDIR)$(MANDIR)/man8/cogpud.8 $(DESTDIR)$(MANDIR)/man8/spank_cogpu.8 \
	      $(DESTDIR)$(BASHCOMPDIR)/cogpu
	rm -f $(DESTDIR)$(BINDIR)/cogpu $(DESTDIR)$(LIBDIR)/libcogpu.* \
	      $(DESTDIR)$(INCDIR)/cogpu.h $(DESTDIR)$(INCDIR)/schedgpu.h \
	      $(DESTDIR)$(PCDIR)/cogpu.pc
	rm -rf $(DESTDIR)$(DATADIR)/cogpu

FORMAT_FILES = $(shell git ls-files '*.c' '*.h')
format:
	clang-format -i $(FORMAT_FILES)
format-check:
	clang-format --dry-run -Werror $(FORMAT_FILES)

# One assertion vocabulary (docs/architecture.md): cogpu__assert, checked
# in debug builds only. libc's assert() would abort the host application
# (PyTorch under the preload library) in a release build.
.PHONY: lint
lint:
	@if grep -rnE '(^|[^_a-z])assert[[:space:]]*\(|^[[:space:]]*#[[:space:]]*include[[:space:]]*<assert\.h>' \
	    src tools contrib --include=*.c --include=*.h; then \
	  echo "lint: use cogpu__assert (debug builds) or _Static_assert, not assert() or <assert.h>" >&2; \
	  exit 1; fi

clean:
	rm -rf build build-asan build-tsan build-debug

-include $(LIB_OBJS:.o=.d) $(CLI_OBJS:.o=.d) $(SIM_OBJS:.o=.d) $(DAEMON_OBJS:.o=.d) $(TEST_OBJS:.o=.d) \
         $(PRELOAD_OBJS:.o=.d) $(SPANK_OBJS:.o=.d) $(B)/objpn/src/preload/account.d
