# trex — GNU Makefile.
#   make            build build/trex (library, CLI, tests)
#   make test       the whole suite: unit and script tests, then the ASan+UBSan build of the C tests
#                   (with AMX emulated, AMX_EMU=1 below)
#   make asan       only the ASan+UBSan build (AMX emulated) and its tests
#   make demo       install missing dependencies, build, run the main job on an embedded default
#   make fuzz       build the libFuzzer targets (clang) into $(BUILD)/fuzz
# BUILD=dir puts every output under dir (several builds can coexist); OPT="-O1 -g" sets optimisation.
# AMX_EMU=1 builds a test tree whose amx level runs its tile instructions in C (kernels/x86/amx/emu.h)
# on any AVX-512 BF16 machine: right results, no speed (tests/run.sh tests the AMX leaves with it).

BUILD   ?= build
CC      ?= cc
PYTHON  ?= /usr/bin/python3
WERROR  ?= -Werror
SAN     ?=
AMX_EMU ?=

CPPFLAGS += -Iinclude -Isrc -I/usr/include/coin -D_GNU_SOURCE
OPT      ?= -O2 -g
override CFLAGS += $(OPT) -std=c11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes $(WERROR) \
            -fno-strict-aliasing -pthread
ifeq ($(SAN),1)
override CFLAGS += -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
LDFLAGS  += -fsanitize=address,undefined
endif
AMX_FLAGS := -mamx-tile -mamx-bf16
ifeq ($(AMX_EMU),1)
CPPFLAGS += -DTREX_AMX_EMU
AMX_FLAGS :=
endif
LDLIBS   += -lcjson -lglpk -lCbcSolver -lCbc -lpcre2-8 -lm -pthread

LIB_SRC  := $(shell find src -name '*.c' | sort)
CLI_SRC  := $(sort $(wildcard tools/trex/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
LIB      := $(BUILD)/libtrex.a
TREX     := $(BUILD)/trex

.PHONY: all test test-run asan demo fuzz clean
all: $(TREX) $(TEST_BIN)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

# ISA leaves (STYLE.md rule 9): their flags apply to their folder alone; only the dispatch table
# (src/kernels/dispatch.c) reaches them, after checking that the CPU and the OS support the ISA.
# The avx512 folder's files are F/BW/VL code that both AVX-512 levels run, except those that use
# AVX512_BF16's instructions (the products, and the conversions of kernels/x86/avx512/bf16.h); the
# avx512f folder compiles those a second time without them, for CPUs without AVX512_BF16.
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mfma
AVX512_BF16_SRC := gemm_bf16 attn ce fused swiglu pack
$(BUILD)/obj/src/kernels/x86/avx2/%.o: override CFLAGS += -mavx2 -mfma
$(BUILD)/obj/src/kernels/x86/avx512/%.o: override CFLAGS += $(AVX512_FLAGS)
$(AVX512_BF16_SRC:%=$(BUILD)/obj/src/kernels/x86/avx512/%.o): override CFLAGS += -mavx512bf16
$(BUILD)/obj/src/kernels/x86/avx512f/%.o: override CFLAGS += $(AVX512_FLAGS)
$(BUILD)/obj/src/kernels/x86/amx/%.o: override CFLAGS += $(AMX_FLAGS) $(AVX512_FLAGS) -mavx512bf16
# The emulator's tile products are most of an emulated test's time: vectorised at -O3 and without the
# sanitizers' checks in every build (its own memory is the bounded tile file; ASan still checks the bytes
# a tile load or store touches, in its memcpy).
$(BUILD)/obj/src/kernels/x86/amx/emu.o: override CFLAGS += -O3 -fno-sanitize=all

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(TREX): $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) $(CFLAGS) $(CLI_OBJ) $(LIB) $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(CFLAGS) $< $(LIB) $(LDLIBS) -o $@

# The whole suite: every test of the normal build, then the C tests under ASan+UBSan.
test: all
	bash tests/run.sh $(BUILD) $(BUILD)/asan

test-run: all
	bash tests/run.sh $(BUILD)

asan:
	$(MAKE) BUILD=$(BUILD)/asan SAN=1 AMX_EMU=1 OPT="-O1 -g" all
	ASAN_ONLY=1 bash tests/run.sh $(BUILD)/asan

demo:
	bash scripts/install-deps.sh
	$(MAKE) all
	bash scripts/demo.sh $(BUILD)

FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
fuzz:
	@mkdir -p $(BUILD)/fuzz
	for f in $(FUZZ_SRC); do \
	  clang $(CPPFLAGS) -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined $$f $(filter src/core/%,$(LIB_SRC)) $(LDLIBS) \
	    -o $(BUILD)/fuzz/$$(basename $$f .c) || exit 1; done

clean:
	rm -rf $(BUILD)

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/obj/tests/%.d)
