// Package dashboards holds cgledger's Grafana dashboards and Prometheus
// rules as typed Go values. The JSON and YAML under dashboards/ are
// generated from them (go test ./internal/dashboards -update) and a test
// fails when the files and the code differ.
package dashboards

// Dashboard is the part of Grafana's dashboard model cgledger uses
// (schemaVersion 39).
type Dashboard struct {
	UID           string     `json:"uid"`
	Title         string     `json:"title"`
	Description   string     `json:"description"`
	Tags          []string   `json:"tags"`
	Timezone      string     `json:"timezone"`
	SchemaVersion int        `json:"schemaVersion"`
	Editable      bool       `json:"editable"`
	Refresh       string     `json:"refresh"`
	Time          TimeRange  `json:"time"`
	Templating    Templating `json:"templating"`
	Panels        []Panel    `json:"panels"`
}

// TimeRange is the dashboard's default time range.
type TimeRange struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Templating holds the dashboard's variables.
type Templating struct {
	List []Variable `json:"list"`
}

// Variable is a dashboard variable: the Prometheus data source, or a label
// value query.
type Variable struct {
	Name       string      `json:"name"`
	Label      string      `json:"label"`
	Type       string      `json:"type"`
	Query      any         `json:"query"`
	Datasource *DataSource `json:"datasource,omitempty"`
	Refresh    int         `json:"refresh,omitempty"`
	IncludeAll bool        `json:"includeAll,omitempty"`
	Multi      bool        `json:"multi,omitempty"`
	AllValue   string      `json:"allValue,omitempty"`
	Current    any         `json:"current"`
}

// DataSource names the data source of a panel, target or variable.
type DataSource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Panel is a time series or stat panel.
type Panel struct {
	ID          int         `json:"id"`
	Type        string      `json:"type"`
	Title       string      `json:"title"`
	Description string      `json:"description"`
	GridPos     GridPos     `json:"gridPos"`
	Datasource  DataSource  `json:"datasource"`
	Targets     []Target    `json:"targets"`
	FieldConfig FieldConfig `json:"fieldConfig"`
}

// GridPos places a panel on Grafana's 24-column grid.
type GridPos struct {
	X int `json:"x"`
	Y int `json:"y"`
	W int `json:"w"`
	H int `json:"h"`
}

// Target is one PromQL query of a panel.
type Target struct {
	RefID        string     `json:"refId"`
	Expr         string     `json:"expr"`
	LegendFormat string     `json:"legendFormat"`
	Datasource   DataSource `json:"datasource"`
}

// FieldConfig sets a panel's unit and thresholds.
type FieldConfig struct {
	Defaults FieldDefaults `json:"defaults"`
}

// FieldDefaults is the unit (Grafana's unit ids: s, percentunit, short...),
// the bounds and the thresholds that colour a value.
type FieldDefaults struct {
	Unit       string      `json:"unit"`
	Min        *float64    `json:"min,omitempty"`
	Max        *float64    `json:"max,omitempty"`
	Thresholds *Thresholds `json:"thresholds,omitempty"`
}

// Thresholds is Grafana's threshold model: the first step is the base
// colour (no value), each later step applies from its value upwards.
type Thresholds struct {
	Mode  string          `json:"mode"`
	Steps []ThresholdStep `json:"steps"`
}

// ThresholdStep is one colour from Value upwards; Value is nil (JSON null)
// for the base step.
type ThresholdStep struct {
	Color string   `json:"color"`
	Value *float64 `json:"value"`
}

// steps builds absolute thresholds from a base colour and then pairs of
// value and colour, in ascending order of value.
func steps(base string, rest ...any) *Thresholds {
	t := &Thresholds{Mode: "absolute", Steps: []ThresholdStep{{Color: base}}}
	for i := 0; i+1 < len(rest); i += 2 {
		v := toFloat(rest[i])
		t.Steps = append(t.Steps, ThresholdStep{Color: rest[i+1].(string), Value: &v})
	}
	return t
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int:
		return float64(x)
	case float64:
		return x
	}
	panic("dashboards: a threshold value is an int or a float64")
}

// badAtOne colours 0 green and 1 (or more) red: the 0/1 gauges that say
// something is wrong (stalled, degraded).
var badAtOne = steps("green", 1, "red")

// goodAtOne colours 0 red and 1 green: the 0/1 gauges that say something
// works (connected, up).
var goodAtOne = steps("red", 1, "green")

var promDS = DataSource{Type: "prometheus", UID: "${datasource}"}

// variables are the datasource, instance and tool variables every dashboard
// has. Metrics carry no project label (project ids are not labels), so a
// serve instance stands where a project variable would.
func variables() Templating {
	labelVar := func(name, label, query string) Variable {
		return Variable{Name: name, Label: label, Type: "query", Datasource: &promDS, Refresh: 2,
			Query: map[string]any{"query": query, "refId": name}, IncludeAll: true, Multi: true, AllValue: ".*",
			Current: map[string]any{"text": "All", "value": "$__all"}}
	}
	return Templating{List: []Variable{
		{Name: "datasource", Label: "Data source", Type: "datasource", Query: "prometheus", Current: map[string]any{}},
		labelVar("instance", "Instance", "label_values(cgledger_build_info, instance)"),
		// Every registered tool and built-in has a timeout gauge, whoever
		// serves it and before its first call: the dropdown lists them all.
		labelVar("tool", "Tool", "label_values(cgledger_tool_timeout_seconds, tool)"),
	}}
}

// builder lays panels out two to a row.
type builder struct {
	panels []Panel
}

// add appends a time series panel.
func (b *builder) add(typ, title, desc, unit string, exprs ...[2]string) {
	b.addPanel(typ, title, desc, FieldDefaults{Unit: unit}, exprs...)
}

// stat appends a stat panel: a stat panel always has thresholds, so the
// value's colour says whether it is good.
func (b *builder) stat(title, desc, unit string, th *Thresholds, exprs ...[2]string) {
	b.addPanel("stat", title, desc, FieldDefaults{Unit: unit, Thresholds: th}, exprs...)
}

// bounds sets the last panel's axis or gauge range.
func (b *builder) bounds(lo, hi float64) {
	d := &b.panels[len(b.panels)-1].FieldConfig.Defaults
	d.Min, d.Max = &lo, &hi
}

func (b *builder) addPanel(typ, title, desc string, fd FieldDefaults, exprs ...[2]string) {
	n := len(b.panels)
	p := Panel{ID: n + 1, Type: typ, Title: title, Description: desc, Datasource: promDS,
		GridPos:     GridPos{X: (n % 2) * 12, Y: (n / 2) * 8, W: 12, H: 8},
		FieldConfig: FieldConfig{Defaults: fd}}
	for i, e := range exprs {
		p.Targets = append(p.Targets, Target{RefID: string(rune('A' + i)), Expr: e[0], LegendFormat: e[1], Datasource: promDS})
	}
	b.panels = append(b.panels, p)
}

func newDashboard(uid, title, desc string, b *builder) Dashboard {
	return Dashboard{UID: uid, Title: title, Description: desc, Tags: []string{"cgledger"}, Timezone: "utc",
		SchemaVersion: 39, Editable: true, Refresh: "30s", Time: TimeRange{From: "now-6h", To: "now"},
		Templating: variables(), Panels: b.panels}
}
