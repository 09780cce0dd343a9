"""The JSON line formatter of every log line the webhook writes (gunicorn_conf.logging_config).

python-json-logger's OrjsonFormatter, with two shortcuts that leave every line as it was:

* A record that carries its fields in one attribute (FIELDS, set by server/decision_log.py) is written as
  {time, level, logger, message, **fields} straight away, instead of OrjsonFormatter walking the record's
  attributes and skipping the reserved ones (`merge_record_extra`) to find the same fields. The fields are
  also the record's attributes, as `extra=` makes them, for whatever else reads the record (a filter,
  pytest's caplog); the attribute's leading underscore keeps it out of any JSON formatter's output.
* The time is formatted once per second, the milliseconds per record: `logging.Formatter.formatTime`
  without a datefmt, as a string that cannot change within the second it names.

Any other record (gunicorn's, an exception with its traceback, a formatter configured with fields of its
own) takes OrjsonFormatter's path unchanged.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from pythonjsonlogger.orjson import OrjsonFormatter

# The record attribute holding a line's fields: a dict, in the order the line prints them, whose keys do
# not start with "_" (OrjsonFormatter leaves those out). A line with a key it would leave out or rename (a
# LogRecord attribute, a field of the format) takes OrjsonFormatter's path.
FIELDS = "_json_fields"


class JsonLineFormatter(OrjsonFormatter):  # type: ignore[misc,unused-ignore]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The second formatted last, and its text: replaced whole, so threads never see half an update.
        self._second: tuple[int, str] = (-1, "")
        # The shortcut builds what add_fields would, and only where nothing but the format's fields
        # (each renamed) and the extra fields go into a line.
        direct = not (self.defaults or self.static_fields or self.timestamp or self.rename_fields_keep_missing
                      or self.prefix or self.json_indent or isinstance(self._style, str))
        # Where the shortcut is off, an attribute no record has.
        self._fields_attribute = FIELDS if direct else f"{FIELDS} (not used by this formatter)"
        self._keys = [(field, self._get_rename(field)) for field in self._required_fields]
        self._asctime = "asctime" in self._required_fields
        # The fields OrjsonFormatter would skip (the record's own attributes, the format's) or rename.
        self._not_extra = frozenset(self._skip_fields) | frozenset(self.rename_fields)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None or self.converter is not time.localtime:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached = self._second
        if cached[0] != second:
            cached = (second, time.strftime(self.default_time_format, time.localtime(record.created)))
            self._second = cached
        if not self.default_msec_format:
            return cached[1]
        return self.default_msec_format % (cached[1], record.msecs)

    def format(self, record: logging.LogRecord) -> str:
        attributes = record.__dict__
        fields = attributes.get(self._fields_attribute)
        if fields is None or record.exc_info or record.exc_text or record.stack_info or \
                isinstance(record.msg, dict) or not self._not_extra.isdisjoint(fields):
            return super().format(record)
        # What OrjsonFormatter.format and add_fields do, less the search for the extra fields.
        record.message = record.getMessage()
        if self._asctime:
            record.asctime = self.formatTime(record, self.datefmt)
        data = {key: attributes.get(field) for field, key in self._keys}
        data.update(fields)
        return orjson.dumps(data, default=self.json_default, option=orjson.OPT_NON_STR_KEYS).decode("utf8")
