# Line coverage of the fast tests (the workspace tests `make test-fast` runs), measured with
# cargo-tarpaulin. Its LLVM engine builds with `-C instrument-coverage` and reads the profiles
# itself, so neither the llvm-tools rustup component nor ptrace is needed. Doctests are not
# measured (tarpaulin runs them only on nightly). Included by the root Makefile (CARGO).
#
# The instrumented build has its own target directory, so it never invalidates `target/debug`.

TARPAULIN_VERSION ?= 0.37.5
COVERAGE_DIR ?= target/coverage

.PHONY: coverage
coverage: ## line coverage of `make test-fast` (cargo-tarpaulin); last line `engine_lines_pct=X server_lines_pct=Y`
	@command -v cargo-tarpaulin >/dev/null || \
	  $(CARGO) install cargo-tarpaulin --version $(TARPAULIN_VERSION) --locked --no-default-features
	@mkdir -p $(COVERAGE_DIR)
	@log=$(COVERAGE_DIR)/tarpaulin.log; \
	echo "cargo tarpaulin --workspace (tests of make test-fast) > $$log"; \
	$(CARGO) tarpaulin --workspace --locked --engine llvm --skip-clean --timeout 600 \
	  --target-dir $(COVERAGE_DIR)/build --out Lcov --output-dir $(COVERAGE_DIR) > $$log 2>&1 || \
	  { tail -n 60 $$log; echo "coverage: the tests failed under tarpaulin (full log: $$log)"; exit 1; }; \
	grep -E '^[0-9.]+% coverage' $$log | tail -n 1 | sed 's/^/coverage: tarpaulin total (all crates): /'; \
	echo "coverage: per-line report in $(COVERAGE_DIR)/lcov.info"
	@# One `DA:line,hits` record per coverable line; sum them per prefix of the source path.
	@awk -F'[:,]' -v root="$(CURDIR)/server/src/" ' \
	  /^SF:/ { file = substr($$0, 4); next } \
	  /^DA:/ && index(file, root) == 1 { \
	    hit = ($$3 + 0) > 0; sf++; sh += hit; \
	    if (index(file, root "engine/") == 1) { ef++; eh += hit } } \
	  END { \
	    if (sf == 0 || ef == 0) { print "coverage: no lines of server/src in the report" > "/dev/stderr"; exit 1 } \
	    printf "engine_lines_pct=%.1f server_lines_pct=%.1f\n", 100 * eh / ef, 100 * sh / sf }' \
	  $(COVERAGE_DIR)/lcov.info
