package panel

import (
	"context"
	"net/url"
	"strconv"
	"time"
)

// The daily spend chart: the month's charges summed per day, drawn as an
// SVG bar chart on the server (presentation attributes only: the CSP
// allows no inline style).

// Chart geometry in SVG user units.
const (
	chartWidth   = 720
	chartHeight  = 160
	chartPadTop  = 8
	chartPadFoot = 20
	// chartPages bounds the ledger pages (of 1,000 rows) read for the
	// chart; an account charged more rows in the month gets a chart of
	// its newest days, marked partial.
	chartPages    = 5
	chartPageSize = 1000
)

type chart struct {
	Width, Height int
	Bars          []chartBar
	Max, Total    int64
	// Partial is a chart cut short by chartPages.
	Partial bool
	// Baseline is the y of the bars' foot.
	Baseline int
}

type chartBar struct {
	Day            int
	Amount         int64
	X, Y, W, H     int
	LabelX, LabelY int
	ShowLabel      bool
	Date           string
}

// dailyChart sums the month's charges per day from the ledger, newest
// first, reading pages until it passes the month's start.
func (p *Panel) dailyChart(ctx context.Context, q *req, month time.Time) (chart, error) {
	end := month.AddDate(0, 1, 0)
	days := end.Sub(month).Hours() / 24
	sums := make([]int64, int(days))
	c := chart{Width: chartWidth, Height: chartHeight, Baseline: chartHeight - chartPadFoot}
	marker := ""
	for page := 0; ; page++ {
		if page == chartPages {
			c.Partial = true
			break
		}
		path := "/v1/ledger?limit=" + strconv.Itoa(chartPageSize)
		if marker != "" {
			path += "&marker=" + url.QueryEscape(marker)
		}
		var led ledgerPage
		if err := q.api.Get(ctx, Billing, path, &led); err != nil {
			return c, err
		}
		done := len(led.Links) == 0 || len(led.Ledger) == 0
		for _, e := range led.Ledger {
			// A charge is recorded at or after the hour it is for; one
			// recorded before the month began is for an earlier month.
			if e.CreatedAt.Before(month) {
				done = true
				break
			}
			if e.Kind != "charge" {
				continue
			}
			at := e.CreatedAt
			if e.PeriodStart != nil {
				if t, err := time.Parse(time.RFC3339Nano, *e.PeriodStart); err == nil {
					at = t
				}
			}
			if !at.Before(month) && at.Before(end) {
				sums[at.Sub(month)/(24*time.Hour)] -= e.Amount
			}
		}
		if done {
			break
		}
		marker = led.Ledger[len(led.Ledger)-1].ID
	}
	c.layout(month, sums)
	return c, nil
}

// layout places a bar per day, scaled to the largest day.
func (c *chart) layout(month time.Time, sums []int64) {
	for _, v := range sums {
		c.Max = max(c.Max, v)
		c.Total += v
	}
	slot := chartWidth / len(sums)
	span := int64(c.Baseline - chartPadTop)
	for i, v := range sums {
		h := 0
		if c.Max > 0 && v > 0 {
			h = max(1, int(v*span/c.Max))
		}
		x := i*slot + 2
		c.Bars = append(c.Bars, chartBar{Day: i + 1, Amount: v, X: x, W: slot - 4, H: h, Y: c.Baseline - h,
			LabelX: x + (slot-4)/2, LabelY: chartHeight - 6, ShowLabel: i == 0 || (i+1)%5 == 0,
			Date: month.AddDate(0, 0, i).Format("2006-01-02")})
	}
}
