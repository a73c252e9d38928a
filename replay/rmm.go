package replay

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// rmmColumns is the header RMM's logging_resource_adaptor writes.
var rmmColumns = []string{"Thread", "Time", "Action", "Pointer", "Size", "Stream"}

// RMMError is a malformed RMM log: it names the line and the field.
type RMMError struct {
	Line  int
	Field string
	Msg   string
}

func (e *RMMError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	}
	return fmt.Sprintf("line %d, field %s: %s", e.Line, e.Field, e.Msg)
}

// ReadRMM reads an RMM logging_resource_adaptor CSV log
// (Thread,Time,Action,Pointer,Size,Stream) into requests. Pointers are
// remapped to allocation ids; "allocate failure" rows are ignored, as RMM's
// replay benchmark does, but keep their row index so OOM indexes are data
// rows. Times (HH:MM:SS.ffffff) become microseconds from the first row.
func ReadRMM(r io.Reader) ([]Request, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &RMMError{Line: 1, Msg: "empty file: expected the header " + strings.Join(rmmColumns, ",")}
		}
		return nil, csvErr(err)
	}
	if len(head) != len(rmmColumns) {
		return nil, &RMMError{Line: 1, Msg: fmt.Sprintf("header has %d columns, want %s", len(head), strings.Join(rmmColumns, ","))}
	}
	for i, c := range rmmColumns {
		if strings.TrimSpace(head[i]) != c {
			return nil, &RMMError{Line: 1, Field: c, Msg: fmt.Sprintf("header column %d is %q, want %q", i+1, head[i], c)}
		}
	}
	var reqs []Request
	ids := make(map[uint64]int64)
	var nextID, firstUS, lastUS, dayUS int64 = 0, -1, 0, 0
	for row := 0; ; row++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return reqs, nil
		}
		if err != nil {
			return nil, csvErr(err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) != len(rmmColumns) {
			return nil, &RMMError{Line: line, Msg: fmt.Sprintf("%d fields, want %d", len(rec), len(rmmColumns))}
		}
		us, err := parseClock(rec[1])
		if err != nil {
			return nil, &RMMError{Line: line, Field: "Time", Msg: err.Error()}
		}
		if firstUS < 0 {
			firstUS = us
		}
		if us+dayUS < lastUS-3600e6 { // the clock passed midnight
			dayUS += 86400e6
		}
		t := us + dayUS - firstUS
		lastUS = us + dayUS
		ptr, err := parsePointer(rec[3])
		if err != nil {
			return nil, &RMMError{Line: line, Field: "Pointer", Msg: err.Error()}
		}
		size, err := strconv.ParseUint(strings.TrimSpace(rec[4]), 10, 64)
		if err != nil {
			return nil, &RMMError{Line: line, Field: "Size", Msg: fmt.Sprintf("%q is not a byte count", rec[4])}
		}
		stream, err := parseStream(rec[5])
		if err != nil {
			return nil, &RMMError{Line: line, Field: "Stream", Msg: err.Error()}
		}
		switch strings.TrimSpace(rec[2]) {
		case "allocate":
			if ptr == 0 {
				return nil, &RMMError{Line: line, Field: "Pointer", Msg: "allocate of a null pointer"}
			}
			nextID++
			ids[ptr] = nextID
			reqs = append(reqs, Request{Op: OpMalloc, ID: nextID, Size: size, Stream: stream, TimeUS: t})
		case "free":
			id, ok := ids[ptr]
			if !ok {
				id = -1
			}
			delete(ids, ptr)
			reqs = append(reqs, Request{Op: OpFree, ID: id, Size: size, Stream: stream, TimeUS: t})
		case "allocate failure":
			reqs = append(reqs, Request{Op: 0, TimeUS: t}) // keeps row numbering; replays as nothing
		default:
			return nil, &RMMError{Line: line, Field: "Action", Msg: fmt.Sprintf("unknown action %q (want allocate, free or allocate failure)", rec[2])}
		}
	}
}

func csvErr(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return &RMMError{Line: pe.Line, Msg: pe.Err.Error()}
	}
	return err
}

// parseClock reads HH:MM:SS.ffffff as microseconds since midnight.
func parseClock(s string) (int64, error) {
	s = strings.TrimSpace(s)
	var h, m, sec int64
	var frac string
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return 0, fmt.Errorf("%q is not HH:MM:SS.ffffff", s)
	}
	secPart := parts[2]
	if i := strings.IndexByte(secPart, '.'); i >= 0 {
		secPart, frac = secPart[:i], secPart[i+1:]
	}
	var err error
	if h, err = strconv.ParseInt(parts[0], 10, 64); err != nil || h < 0 || h > 23 {
		return 0, fmt.Errorf("%q is not HH:MM:SS.ffffff", s)
	}
	if m, err = strconv.ParseInt(parts[1], 10, 64); err != nil || m < 0 || m > 59 {
		return 0, fmt.Errorf("%q is not HH:MM:SS.ffffff", s)
	}
	if sec, err = strconv.ParseInt(secPart, 10, 64); err != nil || sec < 0 || sec > 60 {
		return 0, fmt.Errorf("%q is not HH:MM:SS.ffffff", s)
	}
	us := int64(0)
	if frac != "" {
		if len(frac) > 9 {
			return 0, fmt.Errorf("%q has too many fraction digits", s)
		}
		f, err := strconv.ParseInt(frac, 10, 64)
		if err != nil || f < 0 {
			return 0, fmt.Errorf("%q is not HH:MM:SS.ffffff", s)
		}
		for i := len(frac); i < 6; i++ {
			f *= 10
		}
		for i := len(frac); i > 6; i-- {
			f /= 10
		}
		us = f
	}
	return ((h*60+m)*60+sec)*1e6 + us, nil
}

// parsePointer reads a %p pointer: 0x-prefixed hex, or (nil).
func parsePointer(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if s == "(nil)" || s == "0" {
		return 0, nil
	}
	h, ok := strings.CutPrefix(strings.ToLower(s), "0x")
	if !ok {
		return 0, fmt.Errorf("%q is not a 0x-prefixed pointer", s)
	}
	v, err := strconv.ParseUint(h, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a pointer", s)
	}
	return v, nil
}

// parseStream reads a stream handle, hex (0x...) or decimal.
func parseStream(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if h, ok := strings.CutPrefix(strings.ToLower(s), "0x"); ok {
		v, err := strconv.ParseUint(h, 16, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not a stream handle", s)
		}
		return int64(v), nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a stream handle", s)
	}
	return v, nil
}
