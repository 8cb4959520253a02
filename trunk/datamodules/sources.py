"""Where rows come from: a Hugging Face hub dataset, local files, or a dataset built into Trunk."""

from __future__ import annotations

import codecs
import contextlib
import csv
import dataclasses
import glob
import gzip
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import datasets
from lightning.pytorch.utilities import rank_zero_info

from trunk.core.atomic import atomic_write
from trunk.core.codec import cache_folder
from trunk.core.tagging import is_tag
from trunk.datamodules import builtin

# File suffix -> (datasets builder, extra builder options). TSV files are read with quoting off,
# because corpora such as SST-2 contain bare quote characters inside unquoted fields.
# only an empty cell is missing: pandas would also read the texts "NA", "None", "null", "nan" ... as missing
TEXT_CELLS = {"keep_default_na": False, "na_values": [""]}
FILE_FORMATS = {
    ".csv": ("csv", TEXT_CELLS),
    ".tsv": ("csv", {"delimiter": "\t", "quoting": csv.QUOTE_NONE, **TEXT_CELLS}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
}
LINES = (
    ".lines"  # a text file of one row per line, split into columns by a regular expression (FileReading.line_pattern)
)
BUILTIN_PREFIX = "trunk:"


@dataclasses.dataclass(frozen=True)
class FileReading:
    """How local files are read (hub and built-in datasets describe themselves).

    column_names: the columns of csv / tsv files that have no header row (their first row is then data).
    file_type: csv, tsv, json, jsonl, parquet or lines, for files whose suffix does not say; unset: by the suffix.
    line_pattern: a regular expression with named groups that splits each non-blank line into those columns
        (TREC's ``DESC:manner How did ...``: ``(?P<label>[A-Z]+):\\S+ (?P<text>.+)``); it implies file_type lines.
        Lines files without a pattern have one column, ``text``.
    encoding: of every text file read (utf-8; latin-1 for older corpora).
    plain_text_as_lines: a ``.txt`` file (or one with no suffix) is one row per line, its column ``text`` (a predict
        input of the user's own, where nothing else is configured).
    delimiter: the one character between the cells of csv files where it is not a comma (``;`` from a spreadsheet
        saved in many locales, ``|``); unset: a comma (a tab in tsv files).
    """

    column_names: tuple[str, ...] | None = None
    file_type: str | None = None
    line_pattern: str | None = None
    encoding: str = "utf-8"
    plain_text_as_lines: bool = False
    delimiter: str | None = None

    def check(self, option: str) -> None:
        """Refuse settings that cannot work, before anything is read (``option``: the options' prefix)."""
        if self.delimiter is not None and (len(self.delimiter) != 1 or self.delimiter in "\"\r\n"):
            raise ValueError(f"{option}.delimiter={self.delimiter!r}: a csv delimiter is one character (';', '|', "
                             "a tab), not a quote or a line break.")
        try:
            codecs.lookup(self.encoding)
        except LookupError:
            raise ValueError(
                f"{option}.encoding={self.encoding!r} is not an encoding Python knows (utf-8, latin-1, cp1252, ...)."
            ) from None
        if self.line_pattern is not None:
            if self.file_type not in (None, LINES[1:]):
                raise ValueError(
                    f"{option}.line_pattern splits lines files; it cannot read file_type={self.file_type!r}. Remove "
                    "one of them."
                )
            try:
                groups = re.compile(self.line_pattern).groupindex
            except re.error as err:
                raise ValueError(
                    f"{option}.line_pattern={self.line_pattern!r} is not a regular expression: {err}."
                ) from None
            if not groups:
                raise ValueError(
                    f"{option}.line_pattern={self.line_pattern!r} has no named groups: name each column as "
                    "(?P<name>...), e.g. (?P<label>[A-Z]+):\\S+ (?P<text>.+)."
                )

    def suffix(self, path: str | Path) -> str:
        """The format a local file is read in: the configured one, else its suffix's."""
        if self.line_pattern is not None:
            return LINES
        if self.file_type:
            return f".{self.file_type.lstrip('.')}"
        suffix = file_format(path)
        return LINES if self.plain_text_as_lines and suffix in (".txt", "") else suffix

    def builder(self, suffix: str, path: Path, role: str) -> tuple[str, dict]:
        """The ``datasets`` builder and its options for a local file of ``suffix`` (one of FILE_FORMATS)."""
        builder, options = FILE_FORMATS[suffix]
        if self.column_names is not None:
            if builder != "csv":
                raise ValueError(
                    f"{role}: column_names is for csv / tsv files without a header; '{path}' is {suffix[1:]}, which "
                    "names its own columns. Remove column_names."
                )
            options = {**options, "column_names": list(self.column_names)}  # pandas' names: the first row is data
        if self.delimiter is not None and builder == "csv":  # json and parquet files have no delimited cells
            options = {**options, "delimiter": self.delimiter}
        return builder, options if builder == "parquet" else {**options, "encoding": self.encoding}

    @property
    def is_default(self) -> bool:
        return self == FileReading()


def options_of(role: str) -> str:
    """Where a split's reading options are set: data.tasks.<task> for data.tasks.<task>.train (data for data.train)."""
    return role.rsplit(".", 1)[0] if role.count(".") > 1 else "data"


def load_split(dataset: str | None, dataset_config: str | None, split: str, role: str,
               reading: FileReading = FileReading()) -> datasets.Dataset:
    """Load one split.

    ``dataset`` None: ``split`` is a local file path, read as ``reading`` says. ``dataset`` ``trunk:<name>``: a
    built-in dataset (``split`` is train / validation / test). Otherwise ``dataset`` is a hub name (or a local
    dataset directory) and ``split`` a split name such as ``train`` or ``validation[:50%]``.
    ``role`` names the option for error messages (e.g. ``data.train``).
    """
    if dataset is None:
        return _load_file(split, role, reading)
    owner = options_of(role)
    if not reading.is_default:
        raise ValueError(
            f"{role}: column_names, file_type, line_pattern, encoding and delimiter say how to read local files; hub "
            f"and built-in datasets describe their own columns. Remove them, or leave {owner}.dataset unset for files."
        )
    path = Path(split).expanduser()
    if ("/" in split or path.suffix) and path.is_file():  # a file of the user's own, not a split name such as "test"
        raise ValueError(
            f"{role}='{split}' is a file, but {owner}.dataset='{dataset}' makes every split the name of one of that "
            f"data set's splits. To read files, set {owner}.dataset=null beside it (predicting reads only the predict "
            "split, so the others may stay as they are)."
        )
    if dataset.startswith(BUILTIN_PREFIX):
        return builtin.load(dataset[len(BUILTIN_PREFIX):], split)
    local = Path(dataset).expanduser().is_dir()
    try:
        return datasets.load_dataset(dataset, dataset_config, split=split,
                                     cache_dir=datasets_cache(dataset, split) if local else None)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        raise ValueError(
            f"Could not load split '{split}' ({role}) of dataset '{dataset}'"
            f"{f' (config {dataset_config!r})' if dataset_config else ''}: {err}\n"
            f"Check the dataset name, {owner}.dataset_config and the split name; hub datasets need network access "
            f"(or a filled Hugging Face cache). For local files, leave {owner}.dataset unset and give paths."
        ) from err


def stream_rows(dataset: str | None, dataset_config: str | None, split: str, role: str,
                reading: FileReading = FileReading()) -> Iterable[dict]:
    """The rows of one split, read as they are used (``datasets`` streaming): a hub split, or a local
    csv / json / parquet file. Nothing is read up front (lines files, small by nature, are read whole)."""
    if dataset is None:
        path = Path(split).expanduser()
        suffix = reading.suffix(path)
        if not path.is_file() or suffix not in FILE_FORMATS:
            return load_split(None, None, split, role, reading)  # its errors, or a lines file
        builder, options = reading.builder(suffix, path, role)
        return datasets.load_dataset(builder, data_files={"data": str(path)}, split="data", streaming=True, **options)
    if dataset.startswith(BUILTIN_PREFIX):
        return load_split(dataset, dataset_config, split, role)  # small, generated: no need to stream
    try:
        return datasets.load_dataset(dataset, dataset_config, split=split, streaming=True)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        raise ValueError(
            f"Could not stream split '{split}' ({role}) of dataset '{dataset}': {err}\nCheck the dataset name, "
            f"{options_of(role)}.dataset_config and the split name; hub datasets need network access."
        ) from err


def text_lines(path: str | Path, role: str, kind: str = "text", encoding: str = "utf-8") -> Iterator[str]:
    """The lines of a text file (plain or gzip) in ``encoding``, read one at a time, failing clearly on a binary
    file or a byte the encoding does not have, with the file and the line named (before a parser reports it as
    something else)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{role}: file '{path}' {missing(path)}. Give text files (plain or .gz), "
                                f"{'/'.join(FILE_FORMATS)} files, or a split name with {options_of(role)}.dataset.")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            for line_number, line in enumerate(f, start=1):
                if b"\x00" in line:
                    raise ValueError(
                        f"{role}: '{path}' is a binary file (NUL bytes at line {line_number}), not {kind} text. Point "
                        f"{role} at a {kind} file."
                    )
                try:
                    yield line.decode(encoding)
                except UnicodeDecodeError as err:
                    raise ValueError(
                        f"{role}: {path}, line {line_number}: byte {line[err.start]:#04x} at column {err.start + 1} is "
                        f"not {encoding}. Set the file's encoding ({options_of(role)}.encoding: latin-1, cp1252, "
                        "...) or save it as UTF-8."
                    ) from None
    except (OSError, EOFError) as err:  # a truncated or fake .gz
        raise ValueError(f"{role}: could not read '{path}'{' (gzip)' if path.suffix == '.gz' else ''}: {err}") from None


def column(ds: datasets.Dataset, name: str) -> list:
    """One column as a Python list, in one Arrow conversion: iterating ``ds[name]`` (datasets' lazy
    Column) formats row by row, about 100x slower, and it was most of the time of encoding SST-2."""
    return ds[name][:]


def select_rows(ds: datasets.Dataset, where: dict, option: str, source: str) -> datasets.Dataset:
    """The rows whose ``column`` holds the value (or one of the values) ``where`` gives, compared as text."""
    for name, wanted in where.items():
        if name not in ds.column_names:
            raise ValueError(f"{option}: '{source}' has no column '{name}'; its columns are {ds.column_names}.")
        values = {str(v) for v in (wanted if isinstance(wanted, list) else [wanted])}
        cells = [str(c) for c in column(ds, name)]
        keep = [i for i, cell in enumerate(cells) if cell in values]
        if not keep:
            raise ValueError(f"{option}: no row of '{source}' has {name} in {sorted(values)}; the column holds "
                             f"{sorted(set(cells))[:10]}.")
        ds = ds.select(keep)
    return ds


def expand_sources(dataset: str | None, spec: str | list[str], role: str) -> list[str]:
    """A split's sources: one path or split name, a list of them (a dev set shipped as in-domain + out-of-domain files),
    or, for local files, glob patterns (``data/dev_*.tsv``), each matched in sorted order."""
    sources = []
    for one in [spec] if isinstance(spec, str) else list(spec):
        if dataset is None and glob.has_magic(str(one)):
            matches = sorted(glob.glob(str(Path(one).expanduser())))
            if not matches:
                raise FileNotFoundError(f"{role}: no file matches the pattern '{one}'.")
            sources += matches
        else:
            sources.append(str(one))
    if not sources:
        raise ValueError(
            f"{role} is an empty list: give a path (or a list of paths) for this split, or leave it unset."
        )
    return sources


def file_identity(path: Path) -> list:
    """A local file as cache keys see it: a digest of its bytes, wherever it lies, so a copy, a file staged again to a
    job's scratch disk or a disk mounted again keeps the cache entries made from it, and an edit in place changes the
    key whatever it does to the file's size and times. The digest is computed once per version of the file as ``stat``
    sees it (path, size, modification and change times, inode: the change time moves with every write and cannot be
    set back), and kept in the cache: a run reads a file whole for it only where the file changed."""
    info = path.stat()
    seen = [str(path.resolve()), info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
    folder = cache_folder("digests")
    memo = folder / hashlib.sha256(json.dumps(seen).encode()).hexdigest()[:24] if folder is not None else None
    kept = ""
    with contextlib.suppress(OSError, UnicodeDecodeError):  # none kept, or unreadable: computed again
        kept = memo.read_text() if memo is not None else ""
    if re.fullmatch(r"[0-9a-f]{64}", kept):
        return ["sha256", kept]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if memo is not None:
        atomic_write(memo, lambda tmp: tmp.write_text(digest.hexdigest()))
    return ["sha256", digest.hexdigest()]


def source_key(dataset: str | None, spec: str) -> list | str:
    """What a split's rows come from, for cache keys: a local file by its ``file_identity``, a local dataset directory
    by those of every file in it (an edited file changes the key), a hub or built-in split by its name."""
    if dataset is None:
        path = Path(spec).expanduser()
        return file_identity(path) if path.is_file() else spec
    folder = Path(dataset).expanduser()
    if folder.is_dir():
        return [spec, *(file_identity(p) for p in sorted(folder.rglob("*")) if p.is_file())]
    return [dataset, spec]


def datasets_cache(dataset: str | None, spec: str) -> str:
    """A ``datasets`` cache folder of a local source's own ``source_key``: ``datasets`` keys a local file by its
    modification time alone, so an edit that keeps it would be read back from its cache as the old rows."""
    digest = hashlib.sha256(json.dumps(source_key(dataset, spec)).encode()).hexdigest()[:24]
    return str(Path(datasets.config.HF_DATASETS_CACHE) / "trunk-sources" / digest)


def file_format(path: str | Path) -> str:
    """A file's type suffix, looking through .gz: ``train.tsv.gz`` -> ``.tsv``."""
    path = Path(path)
    return Path(path.stem).suffix if path.suffix == ".gz" else path.suffix


@contextlib.contextmanager
def quiet_datasets():
    """No ``datasets`` progress bar while a local file becomes a dataset ("Generating data split: 0 examples"): the file
    is read in a moment, and the bar says nothing a user needs; nor its log line of a file it failed to read, which
    the error raised for it says better."""
    shown, verbosity = not datasets.are_progress_bars_disabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if shown:
            datasets.enable_progress_bars()


def _load_file(path_str: str, role: str, reading: FileReading) -> datasets.Dataset:
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"{role}: file '{path_str}' {missing(path)}. Give the path to a local "
            f"{'/'.join(FILE_FORMATS)} file, or set {options_of(role)}.dataset to load a hub dataset by name."
        )
    suffix = reading.suffix(path)
    if suffix == LINES:
        return read_lines(path, role, reading)
    if suffix not in FILE_FORMATS:
        how = f"file_type={reading.file_type!r}" if reading.file_type else f"unknown file type '{suffix}'"
        raise ValueError(
            f"{role}: cannot read '{path}': {how}. Supported: {', '.join(FILE_FORMATS)}, lines; for a file whose "
            "suffix does not say (a .txt that holds tab-separated rows), set file_type (e.g. tsv), or line_pattern "
            "for one row per line in another shape."
        )
    builder, options = reading.builder(suffix, path, role)
    if builder != "parquet":
        check_text_file(path, role, suffix[1:], reading.encoding)
    try:
        with quiet_datasets():
            return datasets.load_dataset(builder, data_files={"data": str(path)}, split="data",
                                         cache_dir=datasets_cache(None, path_str), **options)
    except (ValueError, datasets.exceptions.DatasetGenerationError) as err:
        if "corresponds to no data" in str(err):  # datasets' way of saying the file has no rows
            raise empty_split_error(role, path_str) from None
        cause = err.__cause__ or err.__context__ or err
        if fields := re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(cause)):
            expected, line, seen = fields.groups()
            separator = "tab" if options.get("delimiter") == "\t" else "comma"
            raise ValueError(
                f"{role}: '{path}' line {line} has {seen} {separator}-separated fields where the file's first row has "
                f"{expected}: a text holding a {separator} splits into more fields. Fix or remove that line"
                + (", or quote the text (\"...\")." if separator == "comma" else ".")
            ) from None
        raise ValueError(
            f"{role}: could not read '{path}' as {suffix[1:]}: {type(cause).__name__}: {str(cause).strip()}. Check "
            f"that the file is {suffix[1:]} (its suffix decides how it is read)."
        ) from None


def read_lines(path: Path, role: str, reading: FileReading) -> datasets.Dataset:
    """One row per non-blank line, its columns the named groups of ``reading.line_pattern`` (or one column,
    ``text``). A line the pattern does not match is an error naming it: a silently skipped line is a lost example."""
    pattern = re.compile(reading.line_pattern or r"(?P<text>.*)")
    rows: dict[str, list[str]] = {name: [] for name in pattern.groupindex}
    for number, line in enumerate(text_lines(path, role, "text", reading.encoding), start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        match = pattern.fullmatch(line)
        if match is None:
            raise ValueError(f"{role}: {path}, line {number} does not match {options_of(role)}.line_pattern "
                             f"{reading.line_pattern!r} (which must match whole lines): {line[:100]!r}.")
        for name, value in match.groupdict().items():
            rows[name].append(value)
    if not next(iter(rows.values())):
        raise empty_split_error(role, str(path))
    return datasets.Dataset.from_dict(rows)


def check_text_file(path: Path, role: str, kind: str = "text", encoding: str = "utf-8") -> None:
    """Fail clearly on an empty, binary or wrongly decoded file (plain or .gz), naming the file and the line."""
    has_text = False
    for line in text_lines(path, role, kind, encoding):  # every line: a bad byte may come after the first text
        has_text = has_text or bool(line.strip())
    if not has_text:
        raise empty_split_error(role, str(path))


def check_filled(values: list, column_name: str, where: str) -> None:
    """Refuse empty cells of a column every row needs, naming the first rows that have them."""
    empty = [i + 1 for i, value in enumerate(values) if value is None]
    if empty:
        rows = ", ".join(map(str, empty[:5])) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        raise ValueError(f"{where}: column '{column_name}' is empty in row{'s' if len(empty) > 1 else ''} {rows} "
                         "(counting data rows from 1, without the header); fill those cells or remove those rows.")


def missing(path: Path) -> str:
    """Why a path that should be a file is not one."""
    return "is a directory, not a file" if path.is_dir() else "does not exist"


def empty_split_error(role: str, spec: str) -> ValueError:
    return ValueError(f"{role} ('{spec}') is empty: it has no rows. Point {role} at a split with data.")


def check_columns(ds: datasets.Dataset, columns: dict[str, str | None], role: str, prefix: str | None = None) -> None:
    """Fail early, naming the option to change (``<prefix>.<option>``), when a configured column is missing (every
    missing one at once)."""
    if prefix is None:  # data.tasks.<task>.train -> data.tasks.<task>
        prefix = options_of(role)
    absent = {option: column for option, column in columns.items()
              if column is not None and column not in ds.column_names}
    if not absent:
        return
    option, column = next(iter(absent.items()))
    if looks_like_data(ds.column_names):
        raise ValueError(
            f"{role} has no column '{column}' (set by {prefix}.{option}). Its first row, {ds.column_names}, "
            "looks like data rather than a header: if the file has no header row, name its columns with "
            f"{prefix}.column_names (e.g. "
            f"{['text', 'label', 'id'][: len(ds.column_names)] + ['...'] * (len(ds.column_names) > 3)}), and "
            f"set {prefix}.{option} to one of those names."
        )
    first = ds[0] if ds.num_rows == 1 else {}  # one JSON object: its rows may be a list inside it
    nested = next((name for name, value in first.items() if isinstance(value, list) and value
                   and isinstance(value[0], dict)), None)
    if nested is not None:
        raise ValueError(
            f"{role} has no column '{column}': the file is one JSON object whose '{nested}' holds the rows "
            f"({len(first[nested])} records). Give the records themselves: a .jsonl file of one per line "
            f"(jq -c '.{nested}[]' FILE > rows.jsonl) or a JSON list."
        )
    delimited = next(((name, mark) for name in map(str, ds.column_names) for mark in ";|\t"
                      if column in name.split(mark)), None)
    if delimited is not None:  # one header cell holding every column: another delimiter than the reader's
        raise ValueError(
            f"{role} has no column '{column}': its header {delimited[0]!r} is one cell, its columns separated "
            f"by {delimited[1]!r}. Set {options_of(role)}.delimiter: {delimited[1]!r} to read them."
        )
    if len(absent) == 1:
        raise ValueError(
            f"{role} has no column '{column}' (set by {prefix}.{option}). Its columns are {ds.column_names}: "
            f"set {prefix}.{option} to one of them."
        )
    named = " and ".join(f"'{column}' (set by {prefix}.{option})" for option, column in absent.items())
    raise ValueError(f"{role} has no columns {named}. Its columns are {ds.column_names}: set each of those options "
                     "to one of them.")


def looks_like_data(names: list[str]) -> bool:
    """Whether a file's "header" is more likely a data row: a number, or a sentence, among the names."""
    return any(str(n).strip().lstrip("-").replace(".", "", 1).isdigit() or len(str(n).split()) > 3 for n in names)


def read_text(path: str | Path, role: str, encoding: str = "utf-8") -> str:
    """The whole of a text file, plain or gzip, with errors that name the option."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{role}: file '{path}' {missing(path)}. Give text files (plain or .gz), "
                                f"{'/'.join(FILE_FORMATS)} files, or a split name with {options_of(role)}.dataset.")
    check_text_file(path, role, encoding=encoding)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding=encoding, newline="") as f:
        return f.read()


ROW_FORMATS = (".json", ".jsonl", ".parquet")  # files of rows with token/tag list columns; others are column files


def read_conll(path: str | Path, tag_column: int = -1, role: str = "data", encoding: str = "utf-8") -> datasets.Dataset:
    """Read a CoNLL-style column file (plain or .gz) into rows of ``tokens``, ``tags`` and ``document``.

    One word per line with whitespace-separated columns: the word first, the tag in ``tag_column``.
    Blank or whitespace-only lines separate sentences; a ``-DOCSTART-`` line starts a new document
    (``document`` counts them from 0; a file without any is one document). Every line must have as
    many columns as the first one. A file with a single column has words only (for prediction);
    its ``tags`` are None.
    """
    path, options = Path(path).expanduser(), options_of(role)
    if not path.is_file():
        raise FileNotFoundError(
            f"{role}: file '{path}' {missing(path)}. Give a CoNLL column file (one word per line, the tag in "
            f"{options}.tag_column), a {'/'.join(ROW_FORMATS)} file, or a split with {options}.dataset."
        )
    check_text_file(path, role, "CoNLL", encoding)
    opener = gzip.open if path.suffix == ".gz" else open
    sentences: list[list[list[str]]] = []
    documents: list[int] = []  # each sentence's document
    current: list[list[str]] = []
    n_columns = first_line = None
    document, document_has_sentences = 0, False
    with opener(path, "rt", encoding=encoding) as f:
        for line_number, line in enumerate(f, start=1):
            columns = line.split()
            if not columns or columns[0] == "-DOCSTART-":
                if current:
                    sentences.append(current)
                    documents.append(document)
                    current, document_has_sentences = [], True
                if columns and document_has_sentences:
                    document, document_has_sentences = document + 1, False
                continue
            if n_columns is None:
                n_columns, first_line = len(columns), line_number
            elif len(columns) != n_columns:
                raise ValueError(f"{role}: {path}:{line_number} has {len(columns)} columns but line {first_line} has "
                                 f"{n_columns}: {line.strip()!r}. Every word line needs the same columns (word first, "
                                 f"tag in {options}.tag_column), separated by whitespace.")
            current.append(columns)
    if current:
        sentences.append(current)
        documents.append(document)
    words = [[row[0] for row in s] for s in sentences]
    if n_columns == 1:
        return datasets.Dataset.from_dict({"tokens": words, "tags": [None] * len(sentences), "document": documents})
    if n_columns is not None and not -n_columns <= tag_column < n_columns:
        raise ValueError(f"{role}: {options}.tag_column={tag_column} does not exist: {path} has {n_columns} columns "
                         f"(0 .. {n_columns - 1}; the word is column 0). Set {options}.tag_column to the tag's column.")
    return datasets.Dataset.from_dict({"tokens": words, "tags": [[row[tag_column] for row in s] for s in sentences],
                                       "document": documents})


def read_words(path: str | Path, tag_column: int = -1, role: str = "data", encoding: str = "utf-8") -> datasets.Dataset:
    """A plain-text input of the user's own to tag (a ``.txt`` predict file): a CoNLL column file (one word per line)
    or one sentence per line, words split on whitespace, as ``predict`` splits a string. It is a column file when it
    has ``-DOCSTART-`` lines, or when every word line has the same number of columns and that is one (words only) or
    its tag column holds tags on every line; else its lines are sentences (of different lengths, or not ending in a
    tag). Which reading it got is said in one line."""
    lines = [line.split() for line in text_lines(path, role, "text", encoding)]
    words = [line for line in lines if line]
    counts = {len(line) for line in words}
    n = len(words[0]) if len(counts) == 1 else 0  # the columns every word line has (0: lines differ)
    tagged = n > 1 and -n <= tag_column < n and all(is_tag(line[tag_column]) for line in words)
    columns = n == 1 or tagged or any(line[0] == "-DOCSTART-" for line in words)
    if columns or not words:
        return read_conll(path, tag_column, role, encoding)
    rank_zero_info(f"{role}: '{path}' read as one sentence per line, words split on whitespace (its lines "
                   f"{'have different numbers of words' if len(counts) > 1 else 'do not end in tags'}, unlike a CoNLL "
                   "column file's: one word per line, blank lines between sentences).")
    return datasets.Dataset.from_dict({"tokens": words, "tags": [None] * len(words), "document": [0] * len(words)})
