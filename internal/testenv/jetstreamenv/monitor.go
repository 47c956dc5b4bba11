package jetstreamenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// ConsumerState is a consumer as nats-server's monitoring endpoint shows it
// (what KEDA's nats-jetstream scaler reads).
type ConsumerState struct {
	Pending    uint64 // num_pending: stored, not yet delivered
	AckPending uint64 // num_ack_pending: delivered, not yet acknowledged
	// Redelivered is num_redelivered: messages delivered more than once
	// and not yet acknowledged.
	Redelivered uint64
	// StreamLast is when the server stored the stream's last message
	// (state.last_ts; zero while the stream is empty): a message taken and
	// acknowledged between two polls still moves it.
	StreamLast time.Time
	// LastDelivered is when the consumer last delivered a message
	// (delivered.last_active; zero before its first).
	LastDelivered time.Time
}

// MonitoredConsumer reads the consumer of stream from the monitoring
// endpoint at addr (host:port, /jsz?consumers=true); found says whether
// /jsz lists it.
func MonitoredConsumer(ctx context.Context, addr, stream, consumer string) (ConsumerState, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/jsz?consumers=true", nil)
	if err != nil {
		return ConsumerState{}, false, err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return ConsumerState{}, false, fmt.Errorf("GET /jsz: %w", err)
	}
	defer resp.Body.Close()
	var jsz struct {
		Accounts []struct {
			Streams []struct {
				Name  string `json:"name"`
				State struct {
					LastTime time.Time `json:"last_ts"`
				} `json:"state"`
				Consumers []struct {
					Name        string `json:"name"`
					NumPending  uint64 `json:"num_pending"`
					AckPending  uint64 `json:"num_ack_pending"`
					Redelivered uint64 `json:"num_redelivered"`
					Delivered   struct {
						Last time.Time `json:"last_active"`
					} `json:"delivered"`
				} `json:"consumer_detail"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil {
		return ConsumerState{}, false, fmt.Errorf("decode /jsz: %w", err)
	}
	for _, a := range jsz.Accounts {
		for _, st := range a.Streams {
			for _, c := range st.Consumers {
				if st.Name == stream && c.Name == consumer {
					return ConsumerState{Pending: c.NumPending, AckPending: c.AckPending, Redelivered: c.Redelivered, StreamLast: st.State.LastTime, LastDelivered: c.Delivered.Last}, true, nil
				}
			}
		}
	}
	return ConsumerState{}, false, nil
}
