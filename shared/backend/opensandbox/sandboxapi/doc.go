// Package sandboxapi is the project's client of the OpenSandbox sandbox
// lifecycle API: a small adapter over a client generated (oapi-codegen, see
// oapi-codegen.yml) from the official specification in spec/.
//
// It follows what the real server does beyond the specification:
//   - requests go to <base URL>/v1 with the API key in OPEN-SANDBOX-API-KEY;
//   - POST /sandboxes answers 202, DELETE 204 and afterwards GET 404; a
//     delete of a sandbox that is already gone is success here;
//   - metadata keys and values follow Kubernetes label rules and keys under
//     opensandbox.io/ are reserved, so metadata is checked before it is sent
//     (ValidateMetadata) and an error names the key, never the value;
//   - GET /sandboxes filters with one `metadata` parameter holding a
//     URL-encoded "k=v&k2=v2" string (MetadataFilter) and pages of at most
//     MaxPageSize; List walks every page;
//   - invalid requests answer 422 with {"detail": [...]}, not the
//     specification's ErrorResponse: every non-2xx answer is an *APIError;
//   - states are an open set: only Terminated and Failed are terminal, and a
//     state this package does not know is not terminal;
//   - X-Request-ID is echoed as sent, so the generated code treats it as a
//     plain string (spec/overlay.yml drops its `format: uuid`).
//
// Environment values given to Create go to the server only: an error never
// includes the request, and a value the server quotes back in its message is
// redacted (values of at least 6 characters; shorter ones are no secrets).
package sandboxapi

//go:generate go tool oapi-codegen -config oapi-codegen.yml spec/sandbox-lifecycle.yml
