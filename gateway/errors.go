package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// OpenAI error types used in error bodies.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable"
)

// apiError is an error answered to a client: an HTTP status and an OpenAI-shaped body.
type apiError struct {
	Status     int
	Type       string
	Message    string
	Param      string // the offending parameter, if any
	Code       string // a stable machine-readable code
	RetryAfter time.Duration
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, code, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Param: param, Code: code, Message: fmt.Sprintf(format, args...)}
}

func invalidParam(param, format string, args ...any) *apiError {
	return badRequest(param, "invalid_value", format, args...)
}

func tooManyRequests(code, msg string, retry time.Duration) *apiError {
	return &apiError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: code, Message: msg, RetryAfter: retry}
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) body() errorBody {
	d := errorDetail{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		d.Param = &e.Param
	}
	if e.Code != "" {
		d.Code = &e.Code
	}
	return errorBody{Error: d}
}

// retryAfterSeconds renders d for a Retry-After header: whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// writeAPIError sends e as an OpenAI-shaped JSON error.
func writeAPIError(w http.ResponseWriter, e *apiError) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", retryAfterSeconds(e.RetryAfter))
	}
	writeJSON(w, e.Status, e.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"cannot encode response","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// fieldError is returned by the custom JSON decoders of polymorphic fields.
type fieldError struct {
	param string
	msg   string
}

func (e *fieldError) Error() string { return e.param + ": " + e.msg }

// decodeJSON decodes a request body into v and turns decoding failures into 400s that
// say where the problem is.
func decodeJSON(data []byte, v any) *apiError {
	if len(bytes.TrimSpace(data)) == 0 {
		return badRequest("", "invalid_json", "request body is empty, want a JSON object")
	}
	err := json.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
		fe  *fieldError
	)
	switch {
	case errors.As(err, &fe):
		return invalidParam(fe.param, "invalid %s: %s", fe.param, fe.msg)
	case errors.As(err, &syn):
		at := max(syn.Offset-1, 0) // Offset counts the offending byte
		line, col := position(data, at)
		return badRequest("", "invalid_json", "invalid JSON at line %d, column %d (byte offset %d): %s", line, col, at, syn.Error())
	case errors.As(err, &typ):
		if typ.Field == "" {
			return badRequest("", "invalid_json", "request body is JSON %s, want an object", typ.Value)
		}
		field := strings.TrimPrefix(typ.Field, "sampling.") // an embedded struct, not part of the API
		line, col := position(data, typ.Offset)
		return invalidParam(field, "invalid type for %q at line %d, column %d: got JSON %s, want %s", field, line, col, typ.Value, jsonKind(typ.Type.Kind().String()))
	default:
		return badRequest("", "invalid_json", "invalid JSON: %v", err)
	}
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer in range"
	case "float32", "float64":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return goKind
}

// position turns a byte offset into a 1-based line and column.
func position(data []byte, off int64) (line, col int) {
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	if off < 0 {
		off = 0
	}
	line, col = 1, 1
	for _, c := range data[:off] {
		if c == '\n' {
			line++
			col = 1
		} else {
			col++
		}
	}
	return line, col
}
