# The documentation site (mkdocs.yml).
#   make docs          build it into site/, strict: a warning (a broken link or anchor) fails
#   make docs-serve    serve it at http://127.0.0.1:8000, rebuilt on every change (warnings shown)
# The tools, pinned in pyproject.toml's `docs` dependency group, are installed once into a folder
# of their own (.docs-tools; Python 3.11 or later); CI runs `make docs` with both folders elsewhere.

PYTHON ?= python3
DOCS_TOOLS ?= .docs-tools
SITE_DIR ?= site
MKDOCS = PYTHONPATH=$(DOCS_TOOLS) PYTHONDONTWRITEBYTECODE=1 NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs

.PHONY: docs docs-serve

docs: $(DOCS_TOOLS)/.installed
	$(MKDOCS) build --strict --site-dir $(SITE_DIR)

docs-serve: $(DOCS_TOOLS)/.installed
	$(MKDOCS) serve

# The group read with tomllib rather than `pip install --group` (pip 25.1 or later): no venv, no
# newer pip, no hvd_lite build. --no-compile saves byte-compiling files never imported; the folder is
# on PYTHONPATH for mkdocs alone, so the versions installed beside the running Python do not matter.
$(DOCS_TOOLS)/.installed: pyproject.toml
	rm -rf $(DOCS_TOOLS)
	$(PYTHON) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["dependency-groups"]["docs"]))' \
	  > $(DOCS_TOOLS).txt
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore \
	  --no-compile --target $(DOCS_TOOLS) -r $(DOCS_TOOLS).txt
	rm -f $(DOCS_TOOLS).txt
	touch $@
