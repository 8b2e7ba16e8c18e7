"""Pages and pictures the site takes from the repository as they are (run by mkdocs-gen-files at build time):
the changelog, and the figures that benchmarks/results holds, so no copy of either lives in docs/."""
from pathlib import Path

import mkdocs_gen_files

REPO = Path(__file__).resolve().parents[2]

# site path -> the repository's file
FIGURES = {
    "assets/compare_digits.png": "benchmarks/results/compare_digits_search8/compare.png",
    "assets/compare_digits_field.png": "benchmarks/results/compare_digits_field/compare.png",
    "assets/compare_digits_field_search8.png": "benchmarks/results/compare_digits_field_search8/compare.png",
    "assets/compare_fmnist384.png": "benchmarks/results/compare_fmnist384_search8/compare.png",
    "assets/compare_fmnist56_field.png": "benchmarks/results/compare_fmnist56_field_search8/compare.png",
    "assets/paper_tables.png": "benchmarks/results/paper_tables.png",
}

for site_path, source in FIGURES.items():
    with mkdocs_gen_files.open(site_path, "wb") as out:
        out.write((REPO / source).read_bytes())

with mkdocs_gen_files.open("changelog.md", "w") as out:
    out.write((REPO / "CHANGELOG.md").read_text())
mkdocs_gen_files.set_edit_path("changelog.md", "../CHANGELOG.md")
